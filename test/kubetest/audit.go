package kubetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// auditPolicy logs every request once, at Metadata level, when its response
// is complete. RequestReceived and ResponseStarted are omitted so one
// finished request is one event, which makes counting trivial. A watch is
// therefore logged only when it ends.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
`

// AuditEvent is the part of an audit.k8s.io/v1 Event the tests look at.
type AuditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	UserAgent string   `json:"userAgent"`
	SourceIPs []string `json:"sourceIPs"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// Code returns the HTTP status of the response, or 0 if none was logged.
func (e AuditEvent) Code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// Resource returns the object's resource ("pods"), or "" for non-resource
// requests such as /readyz.
func (e AuditEvent) Resource() string {
	if e.ObjectRef == nil {
		return ""
	}
	return e.ObjectRef.Resource
}

// ServiceAccountUser is the user name the API server gives a service
// account's tokens, as it appears in AuditEvent.User.Username.
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// readAuditLog returns the events in path whose user is user ("" for all).
// The log backend writes an event after the response has been sent, so a
// request that just returned may not be in the file yet: poll (see
// Cluster.WaitAuditEvents) rather than read once.
func readAuditLog(path, user string) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	defer f.Close()
	var events []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(b, &e); err != nil {
			// The writer may be mid-line; only the last line can be partial.
			if !sc.Scan() {
				break
			}
			return nil, fmt.Errorf("audit log %s line %d: %w", path, line, err)
		}
		if user == "" || e.User.Username == user {
			events = append(events, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return events, nil
}
