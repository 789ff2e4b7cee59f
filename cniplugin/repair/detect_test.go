package repair

import (
	"os"
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

func TestParseArgs(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    Config
		wantErr []string
	}{
		{
			name: "node from the environment, defaults",
			env:  map[string]string{EnvNodeName: "node-a"},
			want: Config{NodeName: "node-a", AdminAddr: DefaultAdminAddr, LogFormat: "plain", LogLevel: "info"},
		},
		{
			name: "flags",
			args: []string{"--admin-addr", "127.0.0.1:9991", "--kubeconfig", "/k", "--node-name", "node-b", "--log-format", "json", "--log-level", "debug"},
			env:  map[string]string{EnvNodeName: "node-a"},
			want: Config{NodeName: "node-b", AdminAddr: "127.0.0.1:9991", Kubeconfig: "/k", LogFormat: "json", LogLevel: "debug"},
		},
		{
			name:    "every problem at once",
			args:    []string{"--admin-addr", "9990", "--log-format", "xml", "--log-level", "loud"},
			wantErr: []string{`--node-name "": not set: set $` + EnvNodeName, `--admin-addr "9990"`, `--log-format "xml"`, `--log-level "loud"`},
		},
		{
			name: "Linkerd's chart: exact command line and environment",
			args: []string{"--admin-addr", "0.0.0.0:9990", "--log-format", "plain", "--log-level", "linkerd_cni_repair_controller=info,warn"},
			env:  map[string]string{EnvNodeName: "node-a", EnvPodName: "linkerd-cni-x7k2p"},
			want: Config{NodeName: "node-a", PodName: "linkerd-cni-x7k2p", AdminAddr: "0.0.0.0:9990", LogFormat: "plain", LogLevel: "linkerd_cni_repair_controller=info,warn"},
		},
		{
			name: "Linkerd's other variables and flags",
			args: []string{"--controller-pod-name", "p2"},
			env:  map[string]string{EnvNodeName: "node-a", EnvPodName: "p1", EnvLogLevel: "debug", EnvLogFormat: "json"},
			want: Config{NodeName: "node-a", PodName: "p2", AdminAddr: DefaultAdminAddr, LogFormat: "json", LogLevel: "debug"},
		},
		{
			name:    "a span filter is refused, naming the value",
			env:     map[string]string{EnvNodeName: "n"},
			args:    []string{"--log-level", "linkerd_cni_repair_controller[pods]=debug"},
			wantErr: []string{`--log-level "linkerd_cni_repair_controller[pods]=debug": span and field filters are not supported`},
		},
		{name: "stray argument", env: map[string]string{EnvNodeName: "n"}, args: []string{"now"}, wantErr: []string{`unexpected arguments ["now"]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(tc.args, env(tc.env))
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("ParseArgs = %+v, want an error", got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseArgs = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestRESTConfigOutsideACluster(t *testing.T) {
	// No flag, no KUBECONFIG, and (in a test) no service account: the error says what to do.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err := RESTConfig("", func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "pass --kubeconfig or set KUBECONFIG") {
		t.Fatalf("RESTConfig = %v, want the in-cluster error with advice", err)
	}
}

func TestRESTConfigFromKubeconfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, server string) string {
		p := dir + "/" + name
		cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + server +
			"\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flagFile := write("flag", "https://192.0.2.1:6443")
	envFile := write("env", "https://192.0.2.2:6443")
	tests := []struct {
		name, flag, env, wantHost string
	}{
		{name: "--kubeconfig wins over KUBECONFIG", flag: flagFile, env: envFile, wantHost: "https://192.0.2.1:6443"},
		{name: "KUBECONFIG list", env: dir + "/missing" + string(os.PathListSeparator) + envFile, wantHost: "https://192.0.2.2:6443"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := RESTConfig(tc.flag, func(k string) string {
				if k == "KUBECONFIG" {
					return tc.env
				}
				return ""
			})
			if err != nil || cfg.Host != tc.wantHost {
				t.Fatalf("RESTConfig = %v, %v; want host %s", cfg, err, tc.wantHost)
			}
		})
	}
}
