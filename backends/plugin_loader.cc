// Finding and opening a backend's plugin: the search path (beside the library, beside the
// executable, the dynamic loader's search) and dlopen with its error kept for the message.
#include "backends/plugin_loader.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <climits>
#include <cstring>

namespace strata::backends {
namespace {

std::string DirOf(const std::string &path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string ExecutablePath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

// The object holding this code as the loader opened it; "" when it is the executable (whose
// link-map name is empty) or cannot be told.
std::string ThisObjectPath() {
  Dl_info info;
  struct link_map *map = nullptr;
  if (dladdr1(reinterpret_cast<void *>(&PluginSearchPath), &info, reinterpret_cast<void **>(&map),
              RTLD_DL_LINKMAP) == 0 ||
      map == nullptr || map->l_name == nullptr || map->l_name[0] == '\0') {
    return "";
  }
  std::string path = map->l_name;
  if (path[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == nullptr) return "";
    path = std::string(cwd) + "/" + path;
  }
  return path;
}

std::string DlError() {
  const char *e = dlerror();
  return e != nullptr ? e : "unknown error";
}

}  // namespace

std::vector<std::string> PluginSearchPath(const std::string &file) {
  std::vector<std::string> places;
  for (const std::string &object : {ThisObjectPath(), ExecutablePath()}) {
    const std::string dir = DirOf(object);
    if (dir.empty()) continue;
    const std::string place = (dir == "/" ? dir : dir + "/") + file;
    bool seen = false;
    for (const std::string &p : places) seen = seen || p == place;
    if (!seen) places.push_back(place);
  }
  places.push_back(file);
  return places;
}

absl::StatusOr<OpenedPlugin> OpenPlugin(const std::vector<std::string> &places, const std::string &what,
                                        const std::string &hint) {
  std::string tried;
  for (size_t i = 0; i < places.size(); ++i) {
    const std::string &place = places[i];
    const bool bare = place.find('/') == std::string::npos;
    if (!tried.empty()) tried += i + 1 == places.size() ? " and " : ", ";
    if (!bare && access(place.c_str(), F_OK) != 0) {
      tried += place;
      continue;
    }
    // Every symbol bound now, so a library the plugin needs but lacks fails here, by name.
    void *handle = dlopen(place.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return OpenedPlugin{handle, place};
    const std::string err = DlError();
    // The loader's search found no file by that name (its message leads with the name); any other
    // error is of a file it found.
    if (bare && err.rfind(place + ": cannot open shared object file", 0) == 0) {
      tried += "the dynamic loader's search for " + place + " (" + err + ")";
      continue;
    }
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s %s cannot be loaded: %s", what, place, err);
  }
  return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s was not found: tried %s%s", what, tried, hint);
}

absl::StatusOr<void *> PluginSymbol(const OpenedPlugin &plugin, const char *symbol, const std::string &what) {
  dlerror();  // clear: a null symbol is an error only when dlerror says so
  void *p = dlsym(plugin.handle, symbol);
  if (p == nullptr) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s %s is not one: it exports no %s (%s)", what, plugin.path, symbol,
                  DlError());
  }
  return p;
}

}  // namespace strata::backends
