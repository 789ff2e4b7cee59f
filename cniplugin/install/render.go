package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// pluginEntry is the rendered plugin configuration that goes into every configuration list.
type pluginEntry struct {
	raw     []byte // compact JSON object
	typ     string // its "type": the binary's name and how our entry is found
	logFile string // its "log_file", a path on the node, or ""
}

// tokenPlaceholder is accepted for old Linkerd templates but never filled: a token copied into the
// conflist outlives its pod and, once revoked, wedges the node. The plugin reads the kubeconfig.
const tokenPlaceholder = "__SERVICEACCOUNT_TOKEN__"

// renderEntry fills the template's placeholders as Linkerd's install-cni.sh does, checks the result
// and adds namespace to "kubernetes.exclude-namespaces". source names the template in errors. It
// returns warnings for the caller to log.
func renderEntry(source, tmpl string, vars map[string]string, namespace string) (*pluginEntry, []string, error) {
	var warnings []string
	if strings.Contains(tmpl, tokenPlaceholder) {
		warnings = append(warnings, fmt.Sprintf("%s: %s is replaced by an empty string: "+
			"the plugin authenticates with the kubeconfig, which is kept up to date", source, tokenPlaceholder))
		tmpl = strings.ReplaceAll(tmpl, tokenPlaceholder, "")
	}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		// Placeholders sit inside JSON strings; escape the value for one.
		q, _ := json.Marshal(vars[k])
		tmpl = strings.ReplaceAll(tmpl, k, string(q[1:len(q)-1]))
	}
	entry, err := parseEntry([]byte(strings.TrimSpace(tmpl)), namespace)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", source, err)
	}
	return entry, warnings, nil
}

// parseEntry checks a rendered entry and adds namespace to its exclude-namespaces.
func parseEntry(data []byte, namespace string) (*pluginEntry, error) {
	members, err := topMembers(data)
	if err != nil {
		return nil, err
	}
	var top struct {
		Type    string `json:"type"`
		LogFile string `json:"log_file"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, err
	}
	if top.Type == "" {
		return nil, errors.New(`"type" must be a non-empty string (the plugin binary's name)`)
	}
	if strings.ContainsAny(top.Type, `/\`) || top.Type == "." || top.Type == ".." {
		return nil, fmt.Errorf(`"type" %q must be a plain file name`, top.Type)
	}
	if namespace != "" {
		if data, err = addExcludedNamespace(data, members, namespace); err != nil {
			return nil, err
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return nil, err
	}
	return &pluginEntry{raw: compact.Bytes(), typ: top.Type, logFile: top.LogFile}, nil
}

// addExcludedNamespace adds ns to the "exclude-namespaces" list of the object's "kubernetes" block,
// creating them when missing. That block is where Linkerd's schema for the entry accepts any key
// (its tests decode the rest strictly). A namespace a user's top-level list names is left there.
func addExcludedNamespace(data []byte, members []member, ns string) ([]byte, error) {
	if s, ok := lookup(members, "exclude-namespaces"); ok {
		list, err := namespaceList(data[s.start:s.end], "exclude-namespaces")
		if err != nil || slices.Contains(list, ns) {
			return data, err
		}
	}
	k8s, ok := lookup(members, "kubernetes")
	if !ok {
		enc, _ := json.Marshal(map[string][]string{"exclude-namespaces": {ns}})
		return appendMember(data, members, 0, "kubernetes", enc), nil // data starts with its brace
	}
	inner, innerOpen, _, err := scanObject(data, k8s.start)
	if err != nil {
		return nil, fmt.Errorf(`"kubernetes" must be an object: %w`, err)
	}
	if s, ok := lookup(inner, "exclude-namespaces"); ok {
		list, err := namespaceList(data[s.start:s.end], "kubernetes.exclude-namespaces")
		if err != nil || slices.Contains(list, ns) {
			return data, err
		}
		enc, _ := json.Marshal(append(list, ns))
		return splice(data, s, enc), nil
	}
	enc, _ := json.Marshal([]string{ns})
	return appendMember(data, inner, innerOpen, "exclude-namespaces", enc), nil
}

// namespaceList decodes an exclude-namespaces value; key names it in the error.
func namespaceList(raw []byte, key string) ([]string, error) {
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%q must be a list of strings: %w", key, err)
	}
	return list, nil
}

// appendMember adds "key":value after the last of members, the object whose brace is at open.
func appendMember(data []byte, members []member, open int, key string, value []byte) []byte {
	ins := []byte(`"` + key + `":` + string(value))
	if len(members) == 0 {
		return splice(data, span{open + 1, open + 1}, ins)
	}
	last := members[len(members)-1].val.end
	return splice(data, span{last, last}, append([]byte{','}, ins...))
}
