// Package stress runs bounded adversarial workloads against the real binaries and prints what it
// saw: concurrent applies, applies racing cleanups, kill -9 during an apply, installer churn while
// the primary CNI rewrites its config (`make stress`: larger counts). Each runs in throwaway
// namespaces and directories and fails on any end state but one complete configuration or nothing
// of ours; half-applied (possible only with one transaction per family) is counted apart.
package stress
