"""Turn a rendered variant into binaries: CMake/Ninja builds (``cmake``) and the HIP compile-check toolchain (``hip``).

Named ``builder``, not ``build``: linters and formatters (ruff, black) and many ignore files skip
every directory called ``build`` as build output."""
