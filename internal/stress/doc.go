// Package stress runs bounded adversarial workloads against the real binaries, as an operator's
// bad day would, and prints what it saw: concurrent identical and different applies, applies
// racing cleanups, random kill -9 during an apply, and installer churn while the primary CNI
// rewrites its config. `make stress` runs it with larger counts; `make test` with small ones.
//
// Every workload runs in throwaway network namespaces (and temporary directories standing in for
// a node's CNI directories) and fails the test on any corrupt end state: anything other than
// exactly one complete configuration, or nothing of ours. A half-applied state (one family
// complete, the other empty) is counted apart; it may only happen where the two families are
// written in two transactions.
package stress
