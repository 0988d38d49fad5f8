# Dependency lookup. Everything comes from Debian 12 packages (cmake/install_deps.sh installs them).
# Abseil is private to the library: none of its types appear in public headers.
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
# Abseil's static archives, linked into the shared library and the CUDA plugin in one group (their
# order then does not matter) so a host needs none of Abseil's shared objects; strata-static.pc
# names them for hosts that link libstrata.a. Only archives of position-independent code can go
# into a shared object: Debian 12's libabsl-dev ships archives built as PIE (a few members reach
# their thread-local variables with local-exec relocations, which no shared object may hold), so
# a probe links a shared object from them first; where it fails, the library and the plugin link
# Abseil's shared objects instead (STRATA_ABSL_STATIC says which). An Abseil built with
# CMAKE_POSITION_INDEPENDENT_CODE=ON, given by absl_DIR, passes.
get_filename_component(STRATA_ABSL_LIBDIR "${absl_DIR}/../.." REALPATH)
file(GLOB STRATA_ABSL_ARCHIVES "${STRATA_ABSL_LIBDIR}/libabsl_*.a")
set(STRATA_ABSL_STATIC OFF)
if(STRATA_ABSL_ARCHIVES)
  include(CheckCXXSourceCompiles)
  include(CMakePushCheckState)
  cmake_push_check_state(RESET)
  get_target_property(strata_absl_includes absl::base INTERFACE_INCLUDE_DIRECTORIES)
  set(CMAKE_REQUIRED_INCLUDES ${strata_absl_includes})
  set(CMAKE_REQUIRED_FLAGS "-fPIC")
  set(CMAKE_REQUIRED_LINK_OPTIONS -shared -Wl,--no-undefined)
  set(CMAKE_REQUIRED_LIBRARIES -Wl,--start-group ${STRATA_ABSL_ARCHIVES} -Wl,--end-group Threads::Threads)
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_source_compiles([[
    #include "absl/status/status.h"
    #include "absl/strings/cord.h"
    #include "absl/synchronization/mutex.h"
    int strata_absl_probe() {
      absl::Mutex mu;
      absl::MutexLock lock(&mu);
      absl::Status st = absl::InternalError("probe");
      st.SetPayload("strata", absl::Cord("1"));
      return st.ok() ? 1 : 0;
    }
    int main() { return strata_absl_probe(); }
  ]] STRATA_ABSL_ARCHIVES_PIC)
  cmake_pop_check_state()
  if(STRATA_ABSL_ARCHIVES_PIC)
    set(STRATA_ABSL_STATIC ON)
  endif()
endif()
if(STRATA_ABSL_STATIC)
  list(JOIN STRATA_ABSL_ARCHIVES "," strata_absl_comma)
  set(STRATA_ABSL_LINK "$<LINK_GROUP:RESCAN,${strata_absl_comma}>")
  message(STATUS "strata: Abseil linked into libstrata.so from its static archives")
else()
  message(STATUS "strata: Abseil's archives in ${STRATA_ABSL_LIBDIR} cannot go into a shared object (not "
                 "position-independent): libstrata.so and the CUDA plugin need Abseil's shared objects")
  set(STRATA_ABSL_LINK absl::status absl::statusor absl::strings absl::str_format absl::synchronization absl::span)
endif()
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
