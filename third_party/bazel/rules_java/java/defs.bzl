"""Offline stand-in for @rules_java: forwards to the native rules of Bazel 4.2.3."""

def java_binary(**kw):
    native.java_binary(**kw)

def java_import(**kw):
    native.java_import(**kw)

def java_library(**kw):
    native.java_library(**kw)

def java_plugin(**kw):
    native.java_plugin(**kw)

def java_test(**kw):
    native.java_test(**kw)

def java_toolchain(**kw):
    native.java_toolchain(**kw)

def java_runtime(**kw):
    native.java_runtime(**kw)
