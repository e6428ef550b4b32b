"""A plugin module that fails at import, as one whose vendor library is absent does."""

raise ImportError("libbroken_npu.so: cannot open shared object file: No such file or directory")
