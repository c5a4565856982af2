// How many CPUs this process may run on: its affinity mask, which a cgroup
// cpuset (a container's --cpuset-cpus, systemd's AllowedCPUs=) or taskset
// narrows. std::thread::hardware_concurrency() counts every CPU online, so a
// pool sized by it on a pinned process puts several threads on each CPU it
// has, and they take turns instead of working.
//
// Thread-safety: any thread (it asks about the calling thread's mask; a
// process's threads inherit the mask they were started with).
#pragma once

namespace wsup {

// At least 1.
int UsableCpus();

}  // namespace wsup
