# Dependency lookup. Everything comes from Debian 12 packages (cmake/install_deps.sh installs them).
# Abseil is private to the library: none of its types appear in public headers.
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(URING IMPORTED_TARGET liburing)
pkg_check_modules(NUMA IMPORTED_TARGET numa)
if(STRATA_BUILD_EXAMPLES)
  # `strata serve`'s HTTP server (Debian's libcpp-httplib-dev: a compiled library; its flags come
  # from pkg-config and must match the build).
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
endif()
if(STRATA_BUILD_TESTS)
  find_package(Catch2 2.13 REQUIRED)
endif()
if(STRATA_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
