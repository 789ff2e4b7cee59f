package agent

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func terminated(code int32, id string) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{ExitCode: code, ContainerID: id,
		FinishedAt: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
}

func TestDetectFailure(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	tests := []struct {
		name     string
		statuses []corev1.ContainerStatus
		init     bool // statuses are init container statuses (else app containers)
		wantOK   bool
		wantLast bool
		wantID   string
	}{
		{name: "no status", init: true},
		{
			name: "current state 95", init: true, wantOK: true, wantID: "containerd://a",
			statuses: []corev1.ContainerStatus{{Name: ValidatorContainer, State: corev1.ContainerState{Terminated: terminated(95, "containerd://a")}}},
		},
		{
			name: "last state 95, restarted and running", init: true, wantOK: true, wantLast: true, wantID: "containerd://b",
			statuses: []corev1.ContainerStatus{{Name: ValidatorContainer, State: running,
				LastTerminationState: corev1.ContainerState{Terminated: terminated(95, "containerd://b")}}},
		},
		{
			name: "both: the current state wins", init: true, wantOK: true, wantID: "containerd://new",
			statuses: []corev1.ContainerStatus{{Name: ValidatorContainer,
				State:                corev1.ContainerState{Terminated: terminated(95, "containerd://new")},
				LastTerminationState: corev1.ContainerState{Terminated: terminated(95, "containerd://old")}}},
		},
		{
			name: "validator passed", init: true,
			statuses: []corev1.ContainerStatus{{Name: ValidatorContainer, State: corev1.ContainerState{Terminated: terminated(0, "containerd://c")}}},
		},
		{
			name: "validator failed otherwise", init: true,
			statuses: []corev1.ContainerStatus{{Name: ValidatorContainer, State: corev1.ContainerState{Terminated: terminated(1, "containerd://d")}}},
		},
		{
			name: "another init container exited 95", init: true,
			statuses: []corev1.ContainerStatus{{Name: "linkerd-init", State: corev1.ContainerState{Terminated: terminated(95, "containerd://e")}}},
		},
		{
			name:     "an app container named like the validator is not the validator",
			statuses: []corev1.ContainerStatus{{Name: ValidatorContainer, State: corev1.ContainerState{Terminated: terminated(95, "containerd://f")}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{}
			if tc.init {
				pod.Status.InitContainerStatuses = tc.statuses
			} else {
				pod.Status.ContainerStatuses = tc.statuses
			}
			f, ok := DetectFailure(pod)
			if ok != tc.wantOK {
				t.Fatalf("DetectFailure ok = %v, want %v", ok, tc.wantOK)
			}
			if !ok {
				return
			}
			if f.InLastState != tc.wantLast || f.ContainerID != tc.wantID {
				t.Fatalf("DetectFailure = %+v, want last state %v, container %s", f, tc.wantLast, tc.wantID)
			}
			if !strings.Contains(f.String(), "exit code 95") || !strings.Contains(f.ID(), tc.wantID) {
				t.Errorf("String %q / ID %q", f.String(), f.ID())
			}
		})
	}
}
