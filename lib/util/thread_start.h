// Starting a thread without exceptions: a std::thread the host refuses (a process or thread limit,
// no address space for its stack) becomes MOE_ERR_NO_MEMORY with a message, so the owner can stop
// and join the threads it already started and return a status instead of unwinding half-built.
#pragma once

#include <functional>
#include <string_view>
#include <thread>

#include "lib/util/status.h"

namespace strata {

// Starts fn on a new thread; `what` names it in the error ("expert I/O thread 2 of 4").
absl::StatusOr<std::thread> StartThread(std::function<void()> fn, std::string_view what);

}  // namespace strata
