// Finding and opening a backend's plugin, a shared object the library loads at run time (the CUDA
// backend's libstrata-cuda.so, backends/cuda_plugin.h). A plugin once opened is never closed: its
// code may run until the process ends.
#pragma once

#include <string>
#include <vector>

#include "lib/util/status.h"

namespace strata::backends {

// Where `file` is looked for when no path is given, in order: the directory of the object holding
// this code as it was loaded (libstrata.so; the executable itself when it linked the library
// statically), the executable's directory, then `file` alone, for the dynamic loader's own search
// (LD_LIBRARY_PATH, the calling object's RUNPATH, the loader's cache and system directories).
// Paths are absolute and appear once.
std::vector<std::string> PluginSearchPath(const std::string &file);

struct OpenedPlugin {
  void *handle = nullptr;  // dlopen's
  std::string path;        // as opened: a place of the search, or the file name the loader found
};

// Opens the first of `places` that exists: a path when its file does, a bare file name when the
// dynamic loader finds it. `what` names the plugin in messages ("the CUDA backend's plugin") and
// `hint` ends the one for a plugin not found. Errors, MOE_ERR_UNSUPPORTED_BACKEND:
//   "<what> was not found: tried /a/x.so, /b/x.so and the dynamic loader's search for x.so (<its
//   error>)<hint>", or, for a file found that does not load (not a shared object, a library it
//   needs missing), "<what> <path> cannot be loaded: <dlopen's error>".
absl::StatusOr<OpenedPlugin> OpenPlugin(const std::vector<std::string> &places, const std::string &what,
                                        const std::string &hint);

// The address of `symbol` in `plugin`; MOE_ERR_UNSUPPORTED_BACKEND when it has none ("<what>
// <path> is not one: it exports no <symbol>").
absl::StatusOr<void *> PluginSymbol(const OpenedPlugin &plugin, const char *symbol, const std::string &what);

}  // namespace strata::backends
