package badinput

import (
	"fmt"
	"testing"
)

func TestRendering(t *testing.T) {
	e := &Error{What: "invalid input", Problems: []Problem{
		{Field: "--proxy-uid", Value: "0", Reason: "refusing to exempt UID 0 (root)"},
		{Field: "annotation config.linkerd.io/skip-outbound-ports", Value: "80,x", On: "pod web/api-0", Reason: `"x" is not a port number`},
	}}
	if got, want := e.Error(), `invalid input: --proxy-uid "0": refusing to exempt UID 0 (root); annotation config.linkerd.io/skip-outbound-ports="80,x" on pod web/api-0: "x" is not a port number`; got != want {
		t.Errorf("Error()\n got %s\nwant %s", got, want)
	}
	if got, want := e.Lines(), "invalid input:\n  --proxy-uid \"0\": refusing to exempt UID 0 (root)\n  annotation config.linkerd.io/skip-outbound-ports=\"80,x\" on pod web/api-0: \"x\" is not a port number\n"; got != want {
		t.Errorf("Lines()\n got %q\nwant %q", got, want)
	}
	if got, ok := As(fmt.Errorf("pod web/api-0: %w", e)); !ok || got != e {
		t.Errorf("As does not find a wrapped *Error: %v %v", got, ok)
	}
	if _, ok := As(fmt.Errorf("plain")); ok {
		t.Error("As found an *Error in a plain error")
	}
}
