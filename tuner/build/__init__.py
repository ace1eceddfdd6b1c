"""Turn a rendered variant into binaries: CMake/Ninja builds (``cmake``) and the HIP compile-check
toolchain (``hip``)."""
