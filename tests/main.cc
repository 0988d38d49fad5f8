// Catch2 entry point for the test executables.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
