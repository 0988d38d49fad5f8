// Tests that set STRATA_* knobs in the environment, as a user would: each change is read again
// into the process's tunables (lib/util/tunables.h otherwise reads the environment once).
#pragma once

#include <cstdlib>
#include <optional>

#include "lib/util/tunables.h"

namespace strata::tunables::testing {

inline std::optional<ScopedValues> &Reread() {
  static std::optional<ScopedValues> scoped;
  scoped.reset();
  scoped.emplace(Read([](const char *name) { return std::getenv(name); }, nullptr));
  return scoped;
}

// setenv / unsetenv, then the tunables read again.
inline int SetKnob(const char *name, const char *value) {
  const int rc = ::setenv(name, value, 1);
  Reread();
  return rc;
}
inline int UnsetKnob(const char *name) {
  const int rc = ::unsetenv(name);
  Reread();
  return rc;
}

}  // namespace strata::tunables::testing
