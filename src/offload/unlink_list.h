// Swap files are removed at every exit we get to run code for (docs/design.md §3.6): destructors
// on a normal exit and on exceptions, and this list on SIGTERM / SIGINT (mpirun sends SIGTERM to
// every rank when one fails or the job is cancelled). The handler only calls unlink(2) on paths
// written before it could run, then hands the signal on to whatever handled it before (the
// collective log's note, a checkpoint's "finish the step" flag) or to the default action. Files
// already open stay readable and writable after unlink, so a handler that lets the step finish
// still finds its state. SIGKILL cannot be caught: its files stay (their names say rank and pid).
#pragma once
#include <string>

namespace zt::offload {

// Registers `path` for unlinking on SIGTERM / SIGINT; returns its slot. Installs the handlers on
// first use. Throws when the fixed list (no allocation in the handler) is full.
int register_for_unlink(const std::string& path);
// The file was removed normally: forget it.
void unregister_for_unlink(int slot);

}  // namespace zt::offload
