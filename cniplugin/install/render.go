package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// pluginEntry is the rendered linkerd-cni plugin configuration that goes
// into every network configuration list.
type pluginEntry struct {
	raw     []byte // compact JSON object
	typ     string // its "type": the binary's name and how our entry is found
	logFile string // its "log_file", a path on the node, or ""
}

// tokenPlaceholder is accepted for compatibility with old Linkerd templates
// but never filled: a token copied into the conflist outlives its pod and,
// once revoked, wedges the node. The plugin reads the kubeconfig instead.
const tokenPlaceholder = "__SERVICEACCOUNT_TOKEN__"

// renderEntry fills the template's placeholders the way Linkerd's
// install-cni.sh does, checks the result and adds namespace to
// "exclude-namespaces". source names the template in errors. It returns
// warnings for the caller to log.
func renderEntry(source, tmpl string, vars map[string]string, namespace string) (*pluginEntry, []string, error) {
	var warnings []string
	if strings.Contains(tmpl, tokenPlaceholder) {
		warnings = append(warnings, fmt.Sprintf("%s: %s is replaced by an empty string: "+
			"the plugin authenticates with the kubeconfig, which is kept up to date", source, tokenPlaceholder))
		tmpl = strings.ReplaceAll(tmpl, tokenPlaceholder, "")
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		// Placeholders sit inside JSON strings; escape the value for one.
		q, _ := json.Marshal(vars[k])
		tmpl = strings.ReplaceAll(tmpl, k, string(q[1:len(q)-1]))
	}
	data := []byte(strings.TrimSpace(tmpl))
	if !json.Valid(data) {
		return nil, nil, fmt.Errorf("%s: %w", source, jsonError(data))
	}
	members, open, closeAt, err := scanObject(data, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", source, err)
	}
	var top struct {
		Type    string `json:"type"`
		LogFile string `json:"log_file"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", source, err)
	}
	if top.Type == "" {
		return nil, nil, fmt.Errorf(`%s: "type" must be a non-empty string (the plugin binary's name)`, source)
	}
	if strings.ContainsAny(top.Type, `/\`) || top.Type == "." || top.Type == ".." {
		return nil, nil, fmt.Errorf(`%s: "type" %q must be a plain file name`, source, top.Type)
	}
	if namespace != "" {
		data, err = addExcludedNamespace(data, members, open, closeAt, namespace)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", source, err)
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", source, err)
	}
	return &pluginEntry{raw: compact.Bytes(), typ: top.Type, logFile: top.LogFile}, warnings, nil
}

// addExcludedNamespace adds ns to the object's "exclude-namespaces" list,
// creating the list when missing and keeping every other key in place.
func addExcludedNamespace(data []byte, members []member, open, closeAt int, ns string) ([]byte, error) {
	if s, ok := lookup(members, "exclude-namespaces"); ok {
		var list []string
		if err := json.Unmarshal(data[s.start:s.end], &list); err != nil {
			return nil, fmt.Errorf(`"exclude-namespaces" must be a list of strings: %w`, err)
		}
		if slices.Contains(list, ns) {
			return data, nil
		}
		list = append(list, ns)
		enc, _ := json.Marshal(list)
		return splice(data, s, enc), nil
	}
	enc, _ := json.Marshal([]string{ns})
	ins := []byte(`"exclude-namespaces":` + string(enc))
	if len(members) == 0 {
		return splice(data, span{open + 1, open + 1}, ins), nil
	}
	last := members[len(members)-1].val.end
	return splice(data, span{last, last}, append([]byte{','}, ins...)), nil
}

// pluginHasKey reports whether the JSON object data has key at its top level.
func pluginHasKey(data []byte, key string) bool {
	members, _, _, err := scanObject(data, 0)
	if err != nil {
		return false
	}
	_, ok := lookup(members, key)
	return ok
}
