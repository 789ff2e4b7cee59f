package cniplugin_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// DEL never fails, even on input skel itself refuses before our Del runs: the runtime would
// otherwise retry the sandbox's teardown forever. Run against the binary the node runs.
func TestDelNeverFailsInTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin binary: skipped with -short")
	}
	bin := filepath.Join(pluginBinaries(t)[0], "linkerd-cni")
	for name, stdin := range map[string]string{
		"empty stdin":     "",
		"not JSON":        "garbage",
		"unknown version": `{"cniVersion":"9.9.9","name":"k8s","type":"linkerd-cni"}`,
		"invalid values":  `{"cniVersion":"1.0.0","name":"k8s","type":"linkerd-cni","linkerd":{"proxy-uid":"x"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = []string{"CNI_COMMAND=DEL", "CNI_CONTAINERID=c1", "CNI_NETNS=/nonexistent", "CNI_IFNAME=eth0", "CNI_PATH=/nonexistent"}
			cmd.Stdin = strings.NewReader(stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Errorf("DEL exited with %v; stdout %q stderr %q", err, stdout.String(), stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("DEL wrote %q to stdout", stdout.String())
			}
		})
	}
	// ADD still refuses what it cannot read, with a CNI error on stdout.
	cmd := exec.Command(bin)
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=/nonexistent", "CNI_IFNAME=eth0", "CNI_PATH=/nonexistent"}
	cmd.Stdin = strings.NewReader("garbage")
	out, err := cmd.Output()
	if err == nil || !strings.Contains(string(out), `"code"`) {
		t.Errorf("ADD of garbage: %v, stdout %q; want exit 1 and a CNI error", err, out)
	}
}
