package install

// Multus writes its config first in the net dir, and runs the pod's default network itself: the
// thin plugin (type "multus") from the copies in its "delegates", the thick one ("multus-shim")
// from the file its "clusterNetwork" names. So linkerd-cni is chained once, where the default
// network runs (after Multus too, it would run twice per pod): into the delegates (and the files
// on disk, which Multus copies again), or the thick plugin's file. Beside Multus, which finds its
// files by name, no .conf becomes a .conflist.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// Multus's plugin types.
const (
	multusThin  = "multus"
	multusThick = "multus-shim"
)

// multusConf is a config file of Multus's, located in its bytes.
type multusConf struct {
	kind           string // multusThin or multusThick
	delegates      []span // the thin plugin's embedded configs
	clusterNetwork string // the thick plugin's default network: a path (as Multus sees it) or a name
}

// parseMultus recognises a config of Multus's: a single plugin of its type, or a list holding one.
func parseMultus(data []byte) (*multusConf, bool) {
	if !json.Valid(data) {
		return nil, false
	}
	obj := span{0, len(data)}
	if isList(data) {
		doc, err := parseList(data)
		if err != nil {
			return nil, false
		}
		i := slices.IndexFunc(doc.types, func(t string) bool { return t == multusThin || t == multusThick })
		if i < 0 {
			return nil, false
		}
		obj = doc.elems[i]
	}
	members, _, _, err := scanObject(data, obj.start)
	if err != nil {
		return nil, false
	}
	m := &multusConf{kind: pluginType(data[obj.start:obj.end])}
	if m.kind != multusThin && m.kind != multusThick {
		return nil, false
	}
	if s, ok := lookup(members, "delegates"); ok && m.kind == multusThin {
		if m.delegates, _, _, err = scanArray(data, s.start); err != nil {
			return nil, false
		}
	}
	if s, ok := lookup(members, "clusterNetwork"); ok {
		_ = json.Unmarshal(data[s.start:s.end], &m.clusterNetwork)
	}
	return m, true
}

// chainMultus chains entry into each delegate of a thin Multus config, and none after Multus.
func chainMultus(data []byte, typ string, entry []byte) ([]byte, error) {
	data, _, err := removeAfterMultus(data, typ)
	if err != nil {
		return nil, err
	}
	return editDelegates(data, func(d []byte) ([]byte, error) {
		if isList(d) {
			return appendEntry(d, typ, entry)
		}
		out, err := convertConf(d, typ, entry, "")
		if err != nil {
			return nil, err
		}
		var compact bytes.Buffer
		err = json.Compact(&compact, out) // as compact as Multus writes its delegates
		return compact.Bytes(), err
	})
}

// unchainMultus returns a Multus config without any entry of type typ, and how many it removed.
func unchainMultus(data []byte, typ string) ([]byte, int, error) {
	data, removed, err := removeAfterMultus(data, typ)
	if err != nil {
		return nil, 0, err
	}
	data, err = editDelegates(data, func(d []byte) ([]byte, error) {
		if !isList(d) {
			return d, nil
		}
		out, n, err := removeEntries(d, typ)
		removed += n
		return out, err
	})
	return data, removed, err
}

// removeAfterMultus removes the entries of type typ chained after Multus (an older install's).
func removeAfterMultus(data []byte, typ string) ([]byte, int, error) {
	if !isList(data) {
		return data, 0, nil
	}
	return removeEntries(data, typ)
}

// editDelegates edits each delegate of a thin Multus config, last first: earlier spans stay valid.
func editDelegates(data []byte, edit func([]byte) ([]byte, error)) ([]byte, error) {
	m, ok := parseMultus(data)
	if !ok {
		return nil, errors.New("not a Multus config")
	}
	for i := len(m.delegates) - 1; i >= 0; i-- {
		d := m.delegates[i]
		if data[d.start] != '{' {
			return nil, fmt.Errorf("delegates[%d] is not an object", i)
		}
		out, err := edit(data[d.start:d.end])
		if err != nil {
			return nil, fmt.Errorf("delegates[%d]: %w", i, err)
		}
		data = splice(data, d, out)
	}
	return data, nil
}
