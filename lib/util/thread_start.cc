// StartThread: std::thread's std::system_error (EAGAIN from pthread_create) as a Status.
#include "lib/util/thread_start.h"

#include <system_error>
#include <utility>

namespace strata {

absl::StatusOr<std::thread> StartThread(std::function<void()> fn, std::string_view what) {
  try {
    return std::thread(std::move(fn));
  } catch (const std::system_error &e) {
    return Errorf(MOE_ERR_NO_MEMORY,
                  "cannot start %s: %s (a limit on processes or threads, or no address space for its stack)", what,
                  e.what());
  }
}

}  // namespace strata
