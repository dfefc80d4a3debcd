#include "signal_cleanup.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>

#include "microscale/output_file.hpp"

namespace microscale::tools {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Set by the first handler to run: a second signal may reach another thread while it removes
// files, and must neither end the process before the removal is done nor remove alongside it.
std::atomic<bool> ending{false};
static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler may only use lock-free atomics");

// Only async-signal-safe calls: remove_unfinished_outputs, write, sigemptyset, sigaction, raise,
// pause. It never returns into the program, so errno and interrupted calls need no care.
extern "C" void remove_and_end(int signal_number) {
  if (ending.exchange(true)) {
    for (;;) ::pause();  // the first handler ends the process
  }
  if (remove_unfinished_outputs() > 0) {
    // The newline ends a progress bar drawn in place.
    static const char message[] = "\nmicroscale: interrupted: removed the outputs it had not finished\n";
    const ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
    static_cast<void>(ignored);
  }
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
  // Pending while this handler runs (the signal is blocked here); delivered on return, with the
  // default action: the process ends by this signal.
  std::raise(signal_number);
}

}  // namespace

void remove_unfinished_outputs_on_signals() {
  struct sigaction action {};
  action.sa_handler = remove_and_end;
  sigemptyset(&action.sa_mask);
  for (int s : kSignals) sigaddset(&action.sa_mask, s);  // one handler at a time
  for (int s : kSignals) {
    struct sigaction previous {};
    if (sigaction(s, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
    sigaction(s, &action, nullptr);
  }
}

}  // namespace microscale::tools
