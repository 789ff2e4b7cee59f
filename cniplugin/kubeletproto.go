package cniplugin

// The protobuf of the kubelet's pods API, decoded by hand: the answers of v1alpha1.Pods (a pod is a
// bytes field holding a core/v1 Pod as its Marshal method writes it, with no envelope), and of
// the Pod only the fields the plugin reads. Field numbers are those of k8s.io/kubelet's
// pkg/apis/pods/v1alpha1/api.proto, k8s.io/api's core/v1/generated.proto and apimachinery's
// meta/v1/generated.proto; kubelet_test.go holds them to the generated types. Unknown fields are
// skipped, as protobuf's rules say; a known field of the wrong wire type, or any length past the
// end of its message, is an error naming the field.

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Protobuf's wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// eachField walks the message b, named what in errors. The fields numbered in known must be
// length-delimited (a string, bytes, an embedded message or a map entry): f gets their bytes, in
// the order they come, and its errors are returned prefixed with the field's name. Other fields are
// skipped.
func eachField(b []byte, what string, known map[uint64]string, f func(num uint64, v []byte) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return fmt.Errorf("%s: a field's tag is not a varint", what)
		}
		b = b[n:]
		num, typ := tag>>3, tag&7
		name, isKnown := known[num]
		switch {
		case num == 0:
			return fmt.Errorf("%s: field number 0", what)
		case !isKnown:
			name = fmt.Sprintf("field %d", num)
		case typ != wireBytes:
			return fmt.Errorf("%s.%s: wire type %d, want %d (length-delimited)", what, name, typ, wireBytes)
		}
		switch typ {
		case wireVarint:
			if _, n = binary.Uvarint(b); n <= 0 {
				return fmt.Errorf("%s.%s: not a varint", what, name)
			}
			b = b[n:]
		case wireFixed64, wireFixed32:
			size := [...]int{wireFixed64: 8, wireFixed32: 4}[typ]
			if len(b) < size {
				return fmt.Errorf("%s.%s: %d bytes left, want %d", what, name, len(b), size)
			}
			b = b[size:]
		case wireBytes: // the only type of a known field
			l, n := binary.Uvarint(b)
			if n <= 0 {
				return fmt.Errorf("%s.%s: its length is not a varint", what, name)
			}
			b = b[n:]
			if l > uint64(len(b)) {
				return fmt.Errorf("%s.%s: length %d, past the end of the message (%d bytes left)", what, name, l, len(b))
			}
			v := b[:l]
			b = b[l:]
			if isKnown {
				if err := f(num, v); err != nil {
					return fmt.Errorf("%s.%s: %w", what, name, err)
				}
			}
		default: // groups (3, 4), long deprecated, and the undefined 6 and 7
			return fmt.Errorf("%s.%s: wire type %d is not supported", what, name, typ)
		}
	}
	return nil
}

// getPodResponse returns the pod of a v1alpha1.GetPodResponse (pod = 1). A response without one
// is an error: the kubelet answers NotFound for a pod it does not have.
func getPodResponse(b []byte) ([]byte, error) {
	var pod []byte
	err := eachField(b, "GetPodResponse", map[uint64]string{1: "pod"}, func(_ uint64, v []byte) error {
		pod = v
		return nil
	})
	if err == nil && pod == nil {
		err = errors.New("GetPodResponse.pod: absent")
	}
	return pod, err
}

// eachPodOfList calls f with each pod of a v1alpha1.ListPodsResponse (repeated pods = 1).
func eachPodOfList(b []byte, f func(i int, pod []byte) error) error {
	i := 0
	return eachField(b, "ListPodsResponse", map[uint64]string{1: "pods"}, func(_ uint64, v []byte) error {
		i++
		return f(i-1, v)
	})
}

// decodePod reads a core/v1 Pod: metadata = 1, spec = 2 (status = 3 is skipped).
func decodePod(b []byte) (*kubeletPod, error) {
	p := &kubeletPod{}
	err := eachField(b, "Pod", map[uint64]string{1: "metadata", 2: "spec"}, func(num uint64, v []byte) error {
		if num == 1 {
			return decodeObjectMeta(v, p)
		}
		return decodePodSpec(v, &p.Spec)
	})
	return p, err
}

// decodeObjectMeta reads meta/v1 ObjectMeta: name = 1, namespace = 3, uid = 5,
// deletionTimestamp = 9 (only whether it is set), labels = 11, annotations = 12.
func decodeObjectMeta(b []byte, p *kubeletPod) error {
	known := map[uint64]string{1: "name", 3: "namespace", 5: "uid", 9: "deletionTimestamp", 11: "labels", 12: "annotations"}
	return eachField(b, "ObjectMeta", known, func(num uint64, v []byte) error {
		switch num {
		case 1:
			p.Name = string(v)
		case 3:
			p.Namespace = string(v)
		case 5:
			p.uid = string(v)
		case 9:
			p.deleting = true
		case 11:
			return mapEntry(v, &p.Labels)
		case 12:
			return mapEntry(v, &p.Annotations)
		}
		return nil
	})
}

// twoStrings reads a message of two string fields: number 1, and the other one known names.
func twoStrings(b []byte, what string, known map[uint64]string) (first, second string, err error) {
	err = eachField(b, what, known, func(num uint64, v []byte) error {
		if num == 1 {
			first = string(v)
		} else {
			second = string(v)
		}
		return nil
	})
	return first, second, err
}

// mapEntry adds one entry of a map<string, string> (key = 1, value = 2) to *m.
func mapEntry(b []byte, m *map[string]string) error {
	k, v, err := twoStrings(b, "entry", map[uint64]string{1: "key", 2: "value"})
	if err != nil {
		return err
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[k] = v
	return nil
}

// decodePodSpec reads core/v1 PodSpec: containers = 2, initContainers = 20; of each Container,
// name = 1, restartPolicy = 24.
func decodePodSpec(b []byte, s *PodSpec) error {
	return eachField(b, "PodSpec", map[uint64]string{2: "containers", 20: "initContainers"}, func(num uint64, v []byte) error {
		name, policy, err := twoStrings(v, "Container", map[uint64]string{1: "name", 24: "restartPolicy"})
		c := Container{Name: name, RestartPolicy: policy}
		if num == 2 {
			s.Containers = append(s.Containers, c)
		} else {
			s.InitContainers = append(s.InitContainers, c)
		}
		return err
	})
}

// protoString appends the string field num = s to b.
func protoString(b []byte, num uint64, s string) []byte {
	b = binary.AppendUvarint(b, num<<3|wireBytes)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
