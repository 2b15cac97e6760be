#include "worker/data/text.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pscluster::data {
namespace {

// The regular files of dir whose names have no '.', sorted.
absl::StatusOr<std::vector<std::string>> FortuneFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          dir,
          ": no such directory; install the corpus with `apt-get install fortunes` or pass "
          "--text_dir"));
    }
    return absl::FailedPreconditionError(absl::StrCat(dir, ": cannot open: ", std::strerror(err)));
  }
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find('.') != std::string::npos) continue;
    struct stat st;
    if (lstat((dir + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  if (names.empty()) {
    return absl::NotFoundError(
        absl::StrCat(dir, " holds no fortune files; install them with `apt-get install fortunes`"));
  }
  return names;
}

}  // namespace

absl::StatusOr<TextCorpus> LoadFortunes(const std::string& dir, int held_out_every) {
  if (held_out_every < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("held_out_every must be >= 2, got ", held_out_every));
  }
  absl::StatusOr<std::vector<std::string>> files = FortuneFiles(dir);
  if (!files.ok()) return files.status();
  TextCorpus corpus;
  int64_t count = 0;
  for (const std::string& name : *files) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    if (!in.good() && !in.eof()) {
      return absl::DataLossError(absl::StrCat(dir, "/", name, ": read failed"));
    }
    std::string fortune;
    auto flush = [&] {
      if (fortune.empty()) return;
      std::string& to = (++count % held_out_every == 0) ? corpus.held_out : corpus.train;
      absl::StrAppend(&to, fortune, "%\n");
      fortune.clear();
    };
    const std::string content = buffer.str();
    absl::string_view lines = content;
    if (lines.empty()) continue;
    if (lines.back() == '\n') lines.remove_suffix(1);  // no empty last line
    for (absl::string_view line : absl::StrSplit(lines, '\n')) {
      if (line == "%") {
        flush();
      } else {
        absl::StrAppend(&fortune, line, "\n");
      }
    }
    flush();  // the text after the last "%", if any
  }
  return corpus;
}

absl::StatusOr<Dataset> MakeLanguageModelData(absl::string_view text, int context) {
  if (context < 1) {
    return absl::InvalidArgumentError(absl::StrCat("context must be >= 1, got ", context));
  }
  const int64_t windows = (static_cast<int64_t>(text.size()) - 1) / context;
  if (windows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a text of ", text.size(),
                                                   " bytes holds no window of ", context,
                                                   " bytes and its next byte"));
  }
  Dataset d;
  d.size = windows;
  d.dim = context;
  d.label_width = context;
  d.classes = kByteVocab;
  d.x.resize(static_cast<size_t>(windows) * context);
  d.y.resize(d.x.size());
  for (size_t i = 0; i < d.x.size(); ++i) {
    d.x[i] = static_cast<float>(static_cast<uint8_t>(text[i]));
    d.y[i] = static_cast<uint8_t>(text[i + 1]);
  }
  return d;
}

}  // namespace pscluster::data
