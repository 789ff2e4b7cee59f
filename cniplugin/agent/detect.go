package agent

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Names shared with the Linkerd chart and the validator.
const (
	// ValidatorContainer is the name of the validator init container Linkerd's injector adds.
	ValidatorContainer = "linkerd-network-validator"
	// ValidatorFailedExitCode is the validator's "the redirect does not work" exit code.
	ValidatorFailedExitCode = 95
	// ControlPlaneNSLabel is on every meshed pod; only pods that have it are watched.
	ControlPlaneNSLabel = "linkerd.io/control-plane-ns"
)

// Failure is a validator termination with exit code 95, as seen in a pod's status.
type Failure struct {
	// InLastState is true when it was found in lastState rather than the current state.
	InLastState bool
	ContainerID string
	FinishedAt  time.Time
}

// ID identifies this termination, so the same failure is recognised across status updates.
func (f Failure) ID() string {
	return fmt.Sprintf("%s@%s", f.ContainerID, f.FinishedAt.UTC().Format(time.RFC3339))
}

func (f Failure) String() string {
	where := "current state"
	if f.InLastState {
		where = "last state"
	}
	return fmt.Sprintf("%s terminated with exit code %d (%s, container %q, finished %s)",
		ValidatorContainer, ValidatorFailedExitCode, where, f.ContainerID, f.FinishedAt.UTC().Format(time.RFC3339))
}

// DetectFailure reports whether pod's validator init container terminated with exit code 95, in
// its current state or its last state. The current state wins when both qualify.
func DetectFailure(pod *corev1.Pod) (Failure, bool) {
	for _, st := range pod.Status.InitContainerStatuses {
		if st.Name != ValidatorContainer {
			continue
		}
		if t := st.State.Terminated; t != nil && t.ExitCode == ValidatorFailedExitCode {
			return Failure{ContainerID: t.ContainerID, FinishedAt: t.FinishedAt.Time}, true
		}
		if t := st.LastTerminationState.Terminated; t != nil && t.ExitCode == ValidatorFailedExitCode {
			return Failure{InLastState: true, ContainerID: t.ContainerID, FinishedAt: t.FinishedAt.Time}, true
		}
	}
	return Failure{}, false
}
