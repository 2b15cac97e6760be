#!/usr/bin/env python3
"""deploy/k8s/: the Kubernetes manifests, checked against each other and against the flags
the binaries define (server/ps/flags.cc, server/coordinator/main.cc, worker/flags.cc,
tools/psctl/main.cc and plan_flags.cc, common/security_flags.cc), and with
deploy/k8s/README.md's commands for the TLS secret.

    /usr/bin/python3 deploy/k8s_manifest_test.py      # from the checkout
    bazel test //deploy:k8s_manifest_test

No cluster is needed. When kubectl is on PATH it also builds the kustomization and decodes
every object offline (`kubectl kustomize`, `kubectl label --local`); `kubectl apply
--dry-run=client` is tried too, and skipped with the reason when it needs an API server.
"""
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest

try:
    import yaml
except ImportError:  # fails the test, saying what is missing
    raise SystemExit("deploy/k8s_manifest_test.py needs PyYAML: apt-get install python3-yaml")

# The checkout. Under `bazel test` this file is a link from the runfiles into it: the flag
# sources are other packages' files, not exported to //deploy, so they are read there (the
# test is tagged "external": it reruns every time instead of caching a stale pass).
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
K8S = os.path.join(ROOT, "deploy", "k8s")
NAMESPACE = "pscluster"
FLAG_SOURCES = {  # binary -> the sources that define its ABSL_FLAGs
    "ps_coordinator": ["server/coordinator/main.cc", "common/metrics_flags.cc",
                       "common/security_flags.cc"],
    "ps_server": ["server/ps/flags.cc", "common/metrics_flags.cc", "common/security_flags.cc"],
    "ps_worker": ["worker/flags.cc", "common/metrics_flags.cc", "common/security_flags.cc"],
    "psctl": ["tools/psctl/main.cc", "tools/psctl/plan_flags.cc", "common/security_flags.cc"],
}
ABSL_OWN_FLAGS = {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch",
                  "version", "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}
WORKLOADS = {"Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole",
                  "ClusterRoleBinding"}
FASHION_MNIST_TRAIN = 60000  # examples per epoch
SHELL_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")"}
REDIRECTIONS = {">", ">>", "<", ">&", "<&"}
SHELL_BUILTINS = {"[", "test", "true", "echo"}  # allowed beside the binaries in a script

# TLS and tokens: Secret pscluster-tls (made by the operator from deploy/make_certs.sh's
# files, README.md), mounted at TLS_DIR. Flag -> the file of the secret it names.
TLS_SECRET = "pscluster-tls"
TLS_DIR = "/var/lib/pscluster/tls"
TLS_FILES = {"tls_ca": "ca.pem", "tls_cert": "node.pem", "tls_key": "node.key",
             "token_file": "cluster.token", "admin_token_file": "admin.token"}
TLS_NEEDS = {  # binary -> the flags it must have (common/security_flags.cc)
    # Servers check both tokens; the coordinator snapshots/restores shards with the admin one.
    "ps_coordinator": set(TLS_FILES),
    "ps_server": set(TLS_FILES),
    # A client that holds the admin token sends it: the worker's table creation and mode
    # switch hand-overs are admin calls. It serves no gRPC.
    "ps_worker": {"tls_ca", "tls_cert", "tls_key", "admin_token_file"},
    "psctl": {"tls_ca"},  # health needs no token; status etc. --token_file (README.md)
}
PSCTL_ADMIN_COMMANDS = {"checkpoint", "switch-mode"}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")

# The overlay README.md gives for kind/minikube/k3d (kept the same as there).
ONE_NODE_OVERLAY = """\
resources:
  - ../k8s
patches:
  - target: {kind: PersistentVolumeClaim, name: shard-checkpoints}
    patch: |-
      - op: replace
        path: /spec/accessModes
        value: [ReadWriteOnce]
"""


def manifest_files():
    return sorted(f for f in os.listdir(K8S)
                  if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml")


def load_manifests():
    docs = []
    for name in manifest_files():
        with open(os.path.join(K8S, name)) as f:
            docs.extend((name, d) for d in yaml.safe_load_all(f) if d is not None)
    return docs


def flag_definitions(binary):
    """{flag name: C++ type} of every ABSL_FLAG in the binary's sources."""
    flags = {}
    for src in FLAG_SOURCES[binary]:
        with open(os.path.join(ROOT, src)) as f:
            text = f.read()
        for ctype, name in re.findall(r"ABSL_FLAG\(\s*(.+?),\s*(\w+)\s*,", text, re.S):
            flags[name] = ctype.strip()
    return flags


def shell_commands(script):
    """The simple commands of a /bin/sh -c script, each as its argv (exec, redirections
    and their targets dropped)."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current, skip_next = [], False
        for token in lexer:
            if skip_next:
                skip_next = False
            elif token in SHELL_SEPARATORS:
                commands.append(current)
                current = []
            elif token in REDIRECTIONS:
                skip_next = True
            else:
                current.append(token)
        commands.append(current)
    commands = [c[1:] if c and c[0] == "exec" else c for c in commands]
    return [c for c in commands if c]


def argvs(command, args=()):
    """(argv list, shell script or None) of a container's command+args or an exec probe."""
    argv = list(command or []) + list(args or [])
    if len(argv) >= 3 and os.path.basename(argv[0]) in ("sh", "bash") and argv[1] == "-c":
        return shell_commands(argv[2]), argv[2]
    return [argv], None


def parse_flags(argv):
    """{name: [values]} of the --flags in argv (value None for a bare --flag)."""
    flags = {}
    for token in argv[1:]:
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            flags.setdefault(name, []).append(value if eq else None)
    return flags


def positionals(argv):
    return [t for t in argv[1:] if not t.startswith("-")]


def readme_commands():
    """The commands of README.md's indented code blocks, each as its argv."""
    with open(os.path.join(K8S, "README.md")) as f:
        block = "\n".join(line[4:] for line in f.read().splitlines()
                          if line.startswith("    "))
    return shell_commands(block)


def quantity(text):
    """Kubernetes quantity -> a number (bytes for memory, cores for CPU)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6,
             "G": 1e9, "T": 1e12, "m": 1e-3}
    text = str(text)
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def under(path, mount):
    return os.path.commonpath([os.path.normpath(path), os.path.normpath(mount)]) == \
        os.path.normpath(mount)


class Cluster:
    """The manifests, with lookups the checks share."""

    def __init__(self):
        self.docs = load_manifests()
        self.objects = [d for _, d in self.docs]

    def of_kind(self, kind):
        return [d for d in self.objects if d.get("kind") == kind]

    def named(self, kind, name):
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"] == name]
        return found[0] if found else None

    def pod_templates(self):
        """(workload, pod template) of every workload."""
        return [(d, d["spec"]["template"]) for d in self.objects if d.get("kind") in WORKLOADS]

    def containers(self):
        """(workload, pod spec, container) of every container."""
        out = []
        for workload, template in self.pod_templates():
            spec = template["spec"]
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                out.append((workload, spec, c))
        return out

    def invocations(self):
        """(container, binary, flags) of every binary a container or an exec probe runs."""
        out = []
        for _, _, c in self.containers():
            runs = [argvs(c.get("command"), c.get("args"))[0]]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if "exec" in c.get(probe, {}):
                    runs.append(argvs(c[probe]["exec"]["command"])[0])
            for argv_list in runs:
                for argv in argv_list:
                    binary = os.path.basename(argv[0])
                    if binary in FLAG_SOURCES:
                        out.append((c, binary, parse_flags(argv)))
        return out

    def main_process(self, binary):
        """(workload, pod spec, container, flags) of the one container whose process is
        `binary`."""
        found = []
        for workload, spec, c in self.containers():
            argv_list, _ = argvs(c.get("command"), c.get("args"))
            for argv in argv_list:
                if os.path.basename(argv[0]) == binary:
                    found.append((workload, spec, c, parse_flags(argv)))
        assert len(found) == 1, f"{len(found)} containers run {binary}, want 1"
        return found[0]


def flag(flags, name):
    values = flags.get(name)
    assert values and len(values) == 1, f"--{name} given {len(values or [])} times, want 1"
    return values[0]


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class K8sManifestTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster()

    # --- the documents -------------------------------------------------------------------

    def test_every_document_has_api_version_kind_name_and_the_namespace(self):
        self.assertTrue(self.c.docs, f"no manifests under {K8S}")
        for file, d in self.c.docs:
            where = f"{file}: {d.get('kind')} {d.get('metadata', {}).get('name')}"
            self.assertIsInstance(d, dict, file)
            for key in ("apiVersion", "kind"):
                self.assertTrue(d.get(key), f"{where}: no {key}")
            self.assertTrue(d.get("metadata", {}).get("name"), f"{where}: no metadata.name")
            if d["kind"] not in CLUSTER_SCOPED:
                self.assertEqual(d["metadata"].get("namespace"), NAMESPACE, where)

    def test_kustomization_lists_every_manifest_and_nothing_else(self):
        with open(os.path.join(K8S, "kustomization.yaml")) as f:
            k = yaml.safe_load(f)
        self.assertEqual(k.get("kind"), "Kustomization")
        self.assertEqual(sorted(k["resources"]), manifest_files())
        self.assertEqual(k.get("namespace"), NAMESPACE)

    def test_names_are_unique_per_kind(self):
        seen = set()
        for d in self.c.objects:
            key = (d["kind"], d["metadata"]["name"])
            self.assertNotIn(key, seen, f"{key} defined twice")
            seen.add(key)

    # --- selectors, ports, Services ------------------------------------------------------

    def test_every_service_selector_matches_the_labels_of_a_pod_template(self):
        for s in self.c.of_kind("Service"):
            selector = s["spec"].get("selector")
            matched = [w for w, t in self.c.pod_templates()
                       if labels_match(selector, t["metadata"].get("labels", {}))]
            self.assertTrue(matched, f"Service {s['metadata']['name']}: selector {selector} "
                                     "matches no pod template")

    def test_every_workload_selector_matches_its_own_template(self):
        for w, t in self.c.pod_templates():
            if w["kind"] == "Job":
                continue  # the Job controller makes its selector
            self.assertTrue(labels_match(w["spec"]["selector"]["matchLabels"],
                                         t["metadata"].get("labels", {})),
                            f"{w['kind']} {w['metadata']['name']}: selector does not match "
                            "its template's labels")

    def test_every_service_target_port_exists_in_the_pods_it_selects(self):
        for s in self.c.of_kind("Service"):
            selector = s["spec"].get("selector")
            ports = [p for w, t in self.c.pod_templates()
                     if labels_match(selector, t["metadata"].get("labels", {}))
                     for c in t["spec"]["containers"] for p in c.get("ports", [])]
            for sp in s["spec"]["ports"]:
                target = sp.get("targetPort", sp["port"])
                self.assertTrue(
                    any(target in (p["containerPort"], p.get("name")) for p in ports),
                    f"Service {s['metadata']['name']}: targetPort {target} is no container "
                    f"port of the pods it selects ({ports})")

    def test_every_probe_port_exists_in_its_container(self):
        for _, _, c in self.c.containers():
            ports = c.get("ports", [])
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                for handler in ("tcpSocket", "httpGet", "grpc"):
                    if handler in c.get(probe, {}):
                        port = c[probe][handler]["port"]
                        self.assertTrue(
                            any(port in (p["containerPort"], p.get("name")) for p in ports),
                            f"{c['name']}: {probe} port {port} is not a container port")

    def test_statefulset_service_is_headless_and_selects_its_pods(self):
        for sts in self.c.of_kind("StatefulSet"):
            svc = self.c.named("Service", sts["spec"]["serviceName"])
            self.assertIsNotNone(svc, f"StatefulSet {sts['metadata']['name']}: serviceName "
                                      f"{sts['spec']['serviceName']} is no Service")
            self.assertEqual(svc["spec"].get("clusterIP"), "None", "not headless")
            self.assertTrue(labels_match(svc["spec"]["selector"],
                                         sts["spec"]["template"]["metadata"]["labels"]),
                            f"Service {svc['metadata']['name']} does not select the "
                            "StatefulSet's pods")

    def test_servers_listen_on_their_container_port(self):
        for binary in ("ps_coordinator", "ps_server"):
            _, _, c, flags = self.c.main_process(binary)
            self.assertEqual(flag(flags, "host"), "0.0.0.0", binary)
            ports = [p["containerPort"] for p in c.get("ports", [])]
            self.assertIn(int(flag(flags, "port")), ports, f"{binary} --port")

    def test_coordinator_addresses_name_the_coordinator_service_and_port(self):
        _, _, _, cflags = self.c.main_process("ps_coordinator")
        port = int(flag(cflags, "port"))
        for binary in ("ps_server", "ps_worker"):
            _, _, _, flags = self.c.main_process(binary)
            host, _, p = flag(flags, "coordinator").rpartition(":")
            svc = self.c.named("Service", host)
            self.assertIsNotNone(svc, f"{binary} --coordinator: no Service {host}")
            coordinator_pods = self.pod_labels("ps_coordinator")
            self.assertTrue(labels_match(svc["spec"]["selector"], coordinator_pods),
                            f"{binary} --coordinator: Service {host} selects no coordinator pod")
            svc_port = [sp for sp in svc["spec"]["ports"] if sp["port"] == int(p)]
            self.assertTrue(svc_port, f"Service {host} has no port {p}")
            target = svc_port[0].get("targetPort", svc_port[0]["port"])
            _, _, cc, _ = self.c.main_process("ps_coordinator")
            numbers = {pp.get("name"): pp["containerPort"] for pp in cc["ports"]}
            self.assertEqual(numbers.get(target, target), port)
        for c, binary, flags in self.c.invocations():
            if binary == "psctl" and "address" not in flags:  # health --address: the probes'
                self.assertEqual(flag(flags, "coordinator"), f"127.0.0.1:{port}")

    def pod_labels(self, binary):
        w, _, _, _ = self.c.main_process(binary)
        return w["spec"]["template"]["metadata"]["labels"]

    # --- counts and identities -----------------------------------------------------------

    def test_worker_job_is_indexed_with_completions_the_coordinators_num_workers(self):
        _, _, _, cflags = self.c.main_process("ps_coordinator")
        job, spec, _, wflags = self.c.main_process("ps_worker")
        n = int(flag(cflags, "num_workers"))
        self.assertEqual(job["kind"], "Job")
        self.assertEqual(job["spec"].get("completionMode"), "Indexed")
        self.assertEqual(job["spec"]["completions"], n, "completions != --num_workers")
        self.assertEqual(job["spec"]["parallelism"], n, "parallelism != --num_workers")
        self.assertEqual(int(flag(wflags, "world")), n, "ps_worker --world != --num_workers")
        self.assertEqual(spec["restartPolicy"], "OnFailure")
        self.assertGreaterEqual(job["spec"].get("backoffLimit", -1), 1, "no backoffLimit")

    def test_shard_statefulset_replicas_are_the_coordinators_num_shards(self):
        _, _, _, cflags = self.c.main_process("ps_coordinator")
        sts, _, _, sflags = self.c.main_process("ps_server")
        n = int(flag(cflags, "num_shards"))
        self.assertEqual(sts["kind"], "StatefulSet")
        self.assertEqual(sts["spec"]["replicas"], n, "replicas != --num_shards")
        self.assertEqual(int(flag(sflags, "num_shards")), n, "ps_server --num_shards")
        self.assertEqual(sts["spec"].get("podManagementPolicy"), "Parallel")
        self.assertEqual(flag(sflags, "restore"), "latest")

    def test_coordinator_is_one_replica_recreated(self):
        dep, _, _, _ = self.c.main_process("ps_coordinator")
        self.assertEqual(dep["kind"], "Deployment")
        self.assertEqual(dep["spec"]["replicas"], 1)
        self.assertEqual(dep["spec"]["strategy"]["type"], "Recreate")

    def test_rank_and_shard_id_come_from_the_pods_identity(self):
        _, _, c, wflags = self.c.main_process("ps_worker")
        self.assertEqual(flag(wflags, "rank"), "$(JOB_COMPLETION_INDEX)")
        self.assertEqual(flag(wflags, "host"), "$(POD_IP)")
        env = {e["name"]: e for e in c.get("env", [])}
        self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        index = env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        self.assertIn("batch.kubernetes.io/job-completion-index", index)
        sts, _, c, sflags = self.c.main_process("ps_server")
        self.assertEqual(flag(sflags, "shard_id"), "${POD_NAME##*-}")  # the ordinal
        self.assertEqual(flag(sflags, "advertise_host"),
                         "${POD_NAME}." + sts["spec"]["serviceName"])
        env = {e["name"]: e for e in c.get("env", [])}
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")

    def test_variable_references_are_defined_in_the_container(self):
        for _, _, c in self.c.containers():
            defined = {e["name"] for e in c.get("env", [])} | {"HOSTNAME"}
            argv_list, script = argvs(c.get("command"), c.get("args"))
            words = [w for argv in argv_list for w in argv]
            for ref in re.findall(r"\$\((\w+)\)", " ".join(words)):  # Kubernetes expands
                self.assertIn(ref, defined, f"{c['name']}: $({ref}) undefined (left as is)")
            for ref in re.findall(r"\$\{?([A-Za-z_]\w*)", script or ""):  # the shell's
                self.assertIn(ref, defined, f"{c['name']}: ${ref} undefined in the script")

    # --- flags and the training ConfigMap ------------------------------------------------

    def test_every_command_is_a_binary_of_the_image_or_a_shell_builtin(self):
        for _, _, c in self.c.containers():
            runs = [argvs(c.get("command"), c.get("args"))]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if "exec" in c.get(probe, {}):
                    runs.append(argvs(c[probe]["exec"]["command"]))
            for argv_list, script in runs:
                for argv in argv_list:
                    ok = argv[0] in {f"/usr/bin/{b}" for b in FLAG_SOURCES} or (
                        script is not None and argv[0] in SHELL_BUILTINS)
                    self.assertTrue(ok, f"{c['name']}: runs {argv[0]}, not one of "
                                        f"/usr/bin/{{{','.join(FLAG_SOURCES)}}}")

    def test_every_flag_is_one_its_binary_defines(self):
        self.assertTrue(self.c.invocations())
        for c, binary, flags in self.c.invocations():
            defined = flag_definitions(binary)
            self.assertTrue(defined, f"no ABSL_FLAG found for {binary}")
            for name in flags:
                bare = name[2:] if name.startswith("no") else None
                ok = name in defined or name in ABSL_OWN_FLAGS or (
                    bare in defined and defined[bare] == "bool")
                self.assertTrue(ok, f"{c['name']}: {binary} defines no --{name} "
                                    f"({', '.join(FLAG_SOURCES[binary])})")

    def test_tryfromenv_flags_exist_and_have_their_env_var(self):
        for c, binary, flags in self.c.invocations():
            env = {e["name"] for e in c.get("env", [])}
            names = [n for v in flags.get("tryfromenv", []) for n in (v or "").split(",")]
            for name in names:
                self.assertIn(name, flag_definitions(binary), f"--tryfromenv={name}: {binary}")
                self.assertIn(f"FLAGS_{name}", env, f"{c['name']}: --tryfromenv={name}")
                self.assertNotIn(name, flags, f"{c['name']}: --{name} given and from env")

    def test_every_flags_env_var_is_read_through_tryfromenv(self):
        for _, _, c in self.c.containers():
            read = set()
            argv_list, _ = argvs(c.get("command"), c.get("args"))
            for argv in argv_list:
                for v in parse_flags(argv).get("tryfromenv", []):
                    read.update((v or "").split(","))
            for e in c.get("env", []):
                if e["name"].startswith("FLAGS_"):
                    self.assertIn(e["name"][len("FLAGS_"):], read,
                                  f"{c['name']}: {e['name']} is set but never read")

    def test_every_config_map_reference_names_an_existing_key(self):
        used = set()
        for _, _, c in self.c.containers():
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    cm = self.c.named("ConfigMap", ref["name"])
                    self.assertIsNotNone(cm, f"{c['name']}: no ConfigMap {ref['name']}")
                    self.assertIn(ref["key"], cm.get("data", {}),
                                  f"{c['name']}: ConfigMap {ref['name']} has no {ref['key']}")
                    used.add((ref["name"], ref["key"]))
            for src in c.get("envFrom", []):
                ref = src.get("configMapRef")
                if ref:
                    cm = self.c.named("ConfigMap", ref["name"])
                    self.assertIsNotNone(cm, f"{c['name']}: envFrom: no ConfigMap {ref['name']}")
                    used.update((ref["name"], k) for k in cm.get("data", {}))
        for cm in self.c.of_kind("ConfigMap"):
            for key in cm.get("data", {}):
                self.assertIn((cm["metadata"]["name"], key), used,
                              f"ConfigMap {cm['metadata']['name']}: {key} reaches no container")

    def training_value(self, binary, name):
        """The ConfigMap value a binary's --<name> takes (through FLAGS_<name>)."""
        _, _, c, _ = self.c.main_process(binary)
        for e in c.get("env", []):
            if e["name"] == f"FLAGS_{name}":
                ref = e["valueFrom"]["configMapKeyRef"]
                return self.c.named("ConfigMap", ref["name"])["data"][ref["key"]]
        self.fail(f"{binary} gets no FLAGS_{name}")

    def test_training_settings_are_valid(self):
        worker = lambda n: self.training_value("ps_worker", n)
        self.assertRegex(worker("epochs"), r"^[1-9][0-9]*$")
        self.assertRegex(worker("batch_size"), r"^[1-9][0-9]*$")
        self.assertGreater(float(worker("lr")), 0)
        self.assertIn(worker("optimizer"), {"sgd", "momentum", "adagrad", "adam", "adamw", "ftrl"})
        self.assertRegex(worker("consistency"), r"^(bsp|asp|ssp:[0-9]+)$")
        mode = self.training_value("ps_coordinator", "mode")
        self.assertIn(mode, {"ps", "allreduce", "fsdp", "pipeline"})

    def test_checkpoint_every_steps_is_an_epochs_worth_of_steps(self):
        _, _, _, cflags = self.c.main_process("ps_coordinator")
        batch = int(self.training_value("ps_worker", "batch_size"))
        workers = int(flag(cflags, "num_workers"))
        self.assertEqual(int(flag(cflags, "checkpoint_every_steps")),
                         FASHION_MNIST_TRAIN // (workers * batch),
                         "--checkpoint_every_steps is not 60000 / (workers * batch_size)")

    # --- resources, probes, security -----------------------------------------------------

    def test_every_container_has_cpu_and_memory_requests_and_limits(self):
        for _, _, c in self.c.containers():
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    self.assertIn(r, res.get(kind, {}), f"{c['name']}: no {kind}.{r}")
                    if kind == "limits":
                        self.assertGreaterEqual(quantity(res["limits"][r]),
                                                quantity(res["requests"][r]), c["name"])

    def test_coordinator_and_shards_have_liveness_and_readiness_probes(self):
        for binary in ("ps_coordinator", "ps_server"):
            _, _, c, _ = self.c.main_process(binary)
            for probe in ("livenessProbe", "readinessProbe"):
                self.assertIn(probe, c, f"{binary}: no {probe}")

    def test_shard_request_memory_budget_fits_its_memory_limit(self):
        # Its default is a quarter of the machine's memory: in a container, the node's.
        _, _, c, sflags = self.c.main_process("ps_server")
        budget = int(flag(sflags, "max_inflight_request_bytes"))
        self.assertLess(budget, quantity(c["resources"]["limits"]["memory"]) / 2)

    def test_every_pod_runs_non_root_without_privilege_escalation(self):
        for w, spec, c in self.c.containers():
            pod = spec.get("securityContext", {})
            sc = c.get("securityContext", {})
            eff = lambda k: sc.get(k, pod.get(k))
            self.assertIs(eff("runAsNonRoot"), True, f"{c['name']}: runAsNonRoot")
            self.assertIsInstance(eff("runAsUser"), int, f"{c['name']}: numeric runAsUser")
            self.assertNotEqual(eff("runAsUser"), 0, c["name"])
            self.assertIs(sc.get("allowPrivilegeEscalation"), False, c["name"])
            self.assertIs(sc.get("readOnlyRootFilesystem"), True, c["name"])
            self.assertIn("ALL", sc.get("capabilities", {}).get("drop", []), c["name"])
            self.assertEqual((eff("seccompProfile") or {}).get("type"), "RuntimeDefault")
            self.assertIn("terminationGracePeriodSeconds", spec, w["metadata"]["name"])

    def test_every_image_is_this_version(self):
        with open(os.path.join(ROOT, "VERSION")) as f:
            version = f.read().strip()
        for _, _, c in self.c.containers():
            self.assertEqual(c.get("image"), f"pscluster:{version}", c["name"])
            self.assertNotEqual(c.get("imagePullPolicy"), "Always",
                                f"{c['name']}: an image loaded into kind/minikube is not pulled")

    def test_servers_probes_ask_psctl_health_over_tls(self):
        # kubelet's grpc probes cannot do TLS; the health service needs no token.
        for binary in ("ps_coordinator", "ps_server"):
            _, _, c, flags = self.c.main_process(binary)
            for probe in PROBES:
                if probe not in c:
                    continue
                p = c[probe]
                self.assertEqual(set(p) & {"grpc", "tcpSocket", "httpGet"}, set(),
                                 f"{binary} {probe}: not an exec probe")
                argvs_, script = argvs(p["exec"]["command"])
                self.assertIsNone(script, f"{binary} {probe}: no shell")
                argv = argvs_[0]
                pflags = parse_flags(argv)
                self.assertEqual(argv[0], "/usr/bin/psctl", f"{binary} {probe}")
                self.assertEqual(positionals(argv), ["health"], f"{binary} {probe}")
                self.assertEqual(flag(pflags, "address"), f"127.0.0.1:{flag(flags, 'port')}",
                                 f"{binary} {probe}: not the server's --port on 127.0.0.1")
                self.assertEqual(flag(pflags, "tls_ca"), f"{TLS_DIR}/{TLS_FILES['tls_ca']}")
                self.assertLessEqual(int(flag(pflags, "timeout_seconds")),
                                     p.get("timeoutSeconds", 1),
                                     f"{binary} {probe}: psctl's deadline outlasts the probe's")

    def test_shards_startup_probe_waits_for_the_restore(self):
        _, _, c, _ = self.c.main_process("ps_server")
        p = c["startupProbe"]
        self.assertGreaterEqual(p.get("periodSeconds", 10) * p.get("failureThreshold", 3), 300)

    # --- TLS and tokens ------------------------------------------------------------------

    def tls_files(self, spec, c):
        """The files of Secret pscluster-tls the container sees under TLS_DIR, read-only."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            secret = volumes.get(m["name"], {}).get("secret", {})
            if m["mountPath"] == TLS_DIR and secret.get("secretName") == TLS_SECRET:
                self.assertIs(m.get("readOnly"), True, f"{c['name']}: {TLS_DIR} not readOnly")
                self.assertNotIn("subPath", m, f"{c['name']}: a subPath mount is never updated")
                items = secret.get("items")
                return ({i["path"] for i in items if i["key"] == i["path"]} if items
                        else set(TLS_FILES.values()))
        return set()

    def test_every_grpc_process_has_tls_and_its_tokens_from_the_secret(self):
        files = {id(c): self.tls_files(spec, c) for _, spec, c in self.c.containers()}
        mutual = any(flags.get("tls_client_auth") not in (None, ["false"])
                     for _, b, flags in self.c.invocations() if b != "psctl")
        self.assertEqual({b for _, b, _ in self.c.invocations()}, set(TLS_NEEDS))
        for c, binary, flags in self.c.invocations():
            where = f"{c['name']}: {binary}"
            needs = set(TLS_NEEDS[binary])
            if binary == "psctl" and mutual:
                needs |= {"tls_cert", "tls_key"}  # --tls_client_auth refuses a certless psctl
            for name in needs:
                self.assertIn(name, flags, f"{where}: no --{name}")
            for name in set(flags) & set(TLS_FILES):
                path = flag(flags, name)
                self.assertEqual(path, f"{TLS_DIR}/{TLS_FILES[name]}", f"{where} --{name}")
                self.assertIn(TLS_FILES[name], files[id(c)],
                              f"{where} --{name}: {path} is not in the mounted {TLS_SECRET}")
            self.assertNotIn("tls_server_name", flags,
                             f"{where}: the certificate carries the names dialled (README.md)")

    def test_tls_secret_volume_is_read_only_and_only_the_pods_group_reads_it(self):
        for w, template in self.c.pod_templates():
            spec = template["spec"]
            where = f"{w['kind']} {w['metadata']['name']}"
            vols = [v for v in spec.get("volumes", [])
                    if v.get("secret", {}).get("secretName") == TLS_SECRET]
            self.assertEqual(len(vols), 1, f"{where}: no {TLS_SECRET} volume")
            secret = vols[0]["secret"]
            mode = secret.get("defaultMode", 0o644)
            self.assertEqual(mode & 0o040, 0o040, f"{where}: defaultMode {mode:o}: no group read")
            self.assertEqual(mode & 0o227, 0, f"{where}: defaultMode {mode:o}: writable or "
                                              "readable by others")
            self.assertIsInstance(spec.get("securityContext", {}).get("fsGroup"), int,
                                  f"{where}: no fsGroup to own the secret's files")
            self.assertIsNot(secret.get("optional"), True, f"{where}: TLS is not optional")
            for item in secret.get("items", []):
                self.assertIn(item["key"], TLS_FILES.values(), f"{where}: {item['key']}")
            for c in spec.get("initContainers", []) + spec["containers"]:
                self.assertTrue(self.tls_files(spec, c), f"{c['name']}: {TLS_SECRET} is not "
                                                         f"mounted at {TLS_DIR}")

    def test_no_secret_is_checked_in(self):
        # The keys and tokens are made per cluster (README.md); ca.key never enters it.
        self.assertEqual([d["metadata"]["name"] for d in self.c.of_kind("Secret")], [])

    def test_readme_makes_the_secret_with_every_file_and_name_the_pods_use(self):
        commands = readme_commands()
        certs = [a for a in commands if os.path.basename(a[0]) == "make_certs.sh"]
        self.assertTrue(certs, "README.md runs no deploy/make_certs.sh")
        # Every name a client dials: the coordinator's Service, each shard's advertised
        # name, and the probes' 127.0.0.1.
        sts, _, _, sflags = self.c.main_process("ps_server")
        dialled = {flag(sflags, "coordinator").rpartition(":")[0], "127.0.0.1"}
        advertised = flag(sflags, "advertise_host")
        dialled |= {advertised.replace("${POD_NAME}", f"{sts['metadata']['name']}-{i}")
                    for i in range(sts["spec"]["replicas"])}
        _, _, _, wflags = self.c.main_process("ps_worker")
        dialled.add(flag(wflags, "coordinator").rpartition(":")[0])
        for argv in certs:
            self.assertLessEqual(dialled, set(argv[2:]), f"README.md: {' '.join(argv)}")
        secrets = [a for a in commands if a[:1] == ["kubectl"] and "secret" in a and
                   TLS_SECRET in a]
        self.assertTrue(secrets, f"README.md: no kubectl create secret generic {TLS_SECRET}")
        for argv in secrets:
            where = f"README.md: {' '.join(argv)}"
            self.assertEqual(argv[argv.index("secret") - 1: argv.index("secret") + 3],
                             ["create", "secret", "generic", TLS_SECRET], where)
            self.assertEqual(argv[argv.index("-n") + 1], NAMESPACE, where)
            keys = {}
            for v in parse_flags(argv).get("from-file", []):
                key, _, path = v.partition("=")
                keys[key] = path
            self.assertEqual(set(keys), set(TLS_FILES.values()), f"{where} (ca.key stays offline)")
            for key, path in keys.items():
                self.assertEqual(os.path.basename(path), key, where)  # make_certs.sh's file

    def test_readme_psctl_commands_have_tls_and_a_token(self):
        runs = [a[[os.path.basename(t) for t in a].index("psctl"):] for a in readme_commands()
                if "psctl" in map(os.path.basename, a)]
        self.assertTrue(runs)
        defined = flag_definitions("psctl")
        for argv in runs:
            where = f"README.md: {' '.join(argv)}"
            flags = parse_flags(argv)
            for name in flags:
                self.assertIn(name, defined, f"{where}: psctl defines no --{name}")
            self.assertEqual(flags.get("tls_ca"), [f"{TLS_DIR}/{TLS_FILES['tls_ca']}"], where)
            command = positionals(argv)[:1]
            if command == ["health"]:
                continue
            token = "admin_token_file" if set(command) & PSCTL_ADMIN_COMMANDS else "token_file"
            self.assertIn(token, flags, f"{where}: no --{token}")
            for name in set(flags) & set(TLS_FILES):
                self.assertEqual(flag(flags, name), f"{TLS_DIR}/{TLS_FILES[name]}", where)

    # --- volumes -------------------------------------------------------------------------

    def test_every_mount_names_a_volume_and_every_claim_exists(self):
        for w, spec, c in self.c.containers():
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            templates = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
            for m in c.get("volumeMounts", []):
                self.assertIn(m["name"], set(volumes) | templates, f"{c['name']}: {m['name']}")
            for v in volumes.values():
                if "persistentVolumeClaim" in v:
                    claim = v["persistentVolumeClaim"]["claimName"]
                    self.assertIsNotNone(self.c.named("PersistentVolumeClaim", claim), claim)

    def claim_under(self, spec, c, path):
        """The PersistentVolumeClaim mounted at or above `path`, or None."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if under(path, m["mountPath"]) and "persistentVolumeClaim" in v:
                return self.c.named("PersistentVolumeClaim",
                                    v["persistentVolumeClaim"]["claimName"])
        return None

    def test_state_directories_are_on_persistent_volumes(self):
        _, spec, c, flags = self.c.main_process("ps_coordinator")
        self.assertIsNotNone(self.claim_under(spec, c, flag(flags, "data_dir")),
                             "coordinator --data_dir is on no PVC")

    def test_shard_snapshots_share_one_read_write_many_volume(self):
        # Every shard reads every shard-* directory under --data_dir at restore, and a step
        # is restorable only when all its shards are there (Snapshotter::Load): a PVC per
        # shard would make --restore=latest start empty.
        sts, spec, c, flags = self.c.main_process("ps_server")
        claim = self.claim_under(spec, c, flag(flags, "data_dir"))
        self.assertIsNotNone(claim, "ps_server --data_dir is on no shared PVC "
                                    "(volumeClaimTemplates give each shard its own)")
        self.assertIn("ReadWriteMany", claim["spec"]["accessModes"])

    def test_written_paths_are_writable_with_a_read_only_root(self):
        for binary, name in (("ps_coordinator", "data_dir"), ("ps_server", "data_dir"),
                             ("ps_worker", "summary_json")):
            _, spec, c, flags = self.c.main_process(binary)
            path = flag(flags, name)
            mounts = [m for m in c.get("volumeMounts", []) if not m.get("readOnly")]
            self.assertTrue(path.startswith("/dev/") or
                            any(under(path, m["mountPath"]) for m in mounts),
                            f"{binary} --{name}={path} is on the read-only root")
            self.assertTrue(any(m["mountPath"] == "/tmp" for m in mounts), f"{binary}: /tmp")

    # --- kubectl, offline ----------------------------------------------------------------

    def test_kubectl_builds_and_decodes_every_object_offline(self):
        kubectl = shutil.which("kubectl")
        if not kubectl:
            print("\nkubectl is not on PATH: skipping the kubectl checks")
            self.skipTest("kubectl is not on PATH")
        with tempfile.TemporaryDirectory() as tmp:
            # No cluster: a kubeconfig whose only server is a closed loopback port.
            config = os.path.join(tmp, "kubeconfig")
            with open(config, "w") as f:
                f.write("apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: "
                        "{server: 'https://127.0.0.1:1'}}]\nusers: [{name: none, user: "
                        "{token: none}}]\ncontexts: [{name: none, context: {cluster: none, "
                        "user: none}}]\ncurrent-context: none\n")
            env = dict(os.environ, KUBECONFIG=config, HOME=tmp)
            k8s = os.path.join(tmp, "k8s")
            shutil.copytree(K8S, k8s)  # real files: kustomize refuses links out of its root
            run = lambda *args, input="": subprocess.run(
                [kubectl, *args], env=env, input=input, capture_output=True, text=True,
                timeout=60)
            kind_name = lambda n: re.sub(r"^([^./]+)[^/]*/", r"\1/", n)  # deployment.apps/x
            want = sorted(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in self.c.objects)

            apply = run("apply", "--dry-run=client", "--validate=false", "-k", k8s, "-o", "name")
            if apply.returncode == 0:
                self.assertEqual(sorted(map(kind_name, apply.stdout.split())), want)
            else:
                last = (apply.stderr.strip().splitlines() or ["?"])[-1]
                print("\nkubectl apply --dry-run=client needs an API server even with "
                      f"--validate=false (its discovery maps kinds): skipped ({last})")

            built = run("kustomize", k8s)
            self.assertEqual(built.returncode, 0, built.stderr)
            objects = [d for d in yaml.safe_load_all(built.stdout) if d]
            self.assertEqual(sorted(f"{d['kind'].lower()}/{d['metadata']['name']}"
                                    for d in objects), want)
            # YAML 1.1's octal defaultMode (0440) read as PyYAML reads it, not as decimal.
            source = {(d["kind"], d["metadata"]["name"]): d for d in self.c.objects}
            for d in objects:
                if d["kind"] in WORKLOADS:
                    self.assertEqual(d["spec"]["template"]["spec"].get("volumes"),
                                     source[(d["kind"], d["metadata"]["name"])]["spec"]
                                     ["template"]["spec"].get("volumes"), d["metadata"]["name"])
            decoded = run("label", "--local", "-f", "-", "check=offline", "-o", "name",
                          input=built.stdout)
            self.assertEqual(decoded.returncode, 0, decoded.stderr)
            self.assertEqual(sorted(map(kind_name, decoded.stdout.split())), want)

            # README.md's overlay for one-node clusters: the same objects, the shards' claim
            # ReadWriteOnce.
            os.mkdir(os.path.join(tmp, "kind"))
            with open(os.path.join(tmp, "kind", "kustomization.yaml"), "w") as f:
                f.write(ONE_NODE_OVERLAY)
            kind = run("kustomize", os.path.join(tmp, "kind"))
            self.assertEqual(kind.returncode, 0, kind.stderr)
            changed = [(d, o) for d, o in zip(objects, yaml.safe_load_all(kind.stdout)) if d != o]
            self.assertEqual([o["metadata"]["name"] for _, o in changed], ["shard-checkpoints"])
            self.assertEqual(changed[0][1]["spec"]["accessModes"], ["ReadWriteOnce"])


if __name__ == "__main__":
    unittest.main()
