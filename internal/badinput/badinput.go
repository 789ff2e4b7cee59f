// Package badinput is the one error type for input refused before anything is written: every
// front end (flags, CNI network config, annotations, environment) reports all its problems at
// once, each naming where the value came from, the value and why. The rule builder's checks
// produce it too, so a front end only renames the fields to what its user typed. UsageError wraps
// it for the commands, which exit 2 on it.
package badinput

import (
	"errors"
	"fmt"
	"strings"
)

// Problem is one refused value.
type Problem struct {
	// Field is what the user set: "--proxy-uid", "annotation config.linkerd.io/proxy-uid", ...;
	// the rule builder's field names ("proxy-uid") are renamed by the front ends.
	Field string
	// Value is the refused value, as given.
	Value  string
	Reason string
	// On names the object the value was found on, when it came from one ("pod web/api-0").
	On string
}

func (p Problem) String() string {
	if p.On != "" {
		return fmt.Sprintf("%s=%q on %s: %s", p.Field, p.Value, p.On, p.Reason)
	}
	return fmt.Sprintf("%s %q: %s", p.Field, p.Value, p.Reason)
}

// Error is every problem found in one input.
type Error struct {
	// What names the input, e.g. "invalid configuration" or "invalid annotation".
	What     string
	Problems []Problem
}

// Error joins the problems on one line, for logs and CNI error messages.
func (e *Error) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return e.What + ": " + strings.Join(parts, "; ")
}

// Lines renders the problems one per line under What, for a command line's standard error.
func (e *Error) Lines() string {
	var b strings.Builder
	b.WriteString(e.What + ":\n")
	for _, p := range e.Problems {
		b.WriteString("  " + p.String() + "\n")
	}
	return b.String()
}

// As returns the *Error err is or wraps.
func As(err error) (*Error, bool) { return errors.AsType[*Error](err) }

// UsageError is a command line a command refuses for its values (Input) or its shape (Message: an
// unknown flag or subcommand, a missing value). The commands exit 2 on it and write nothing.
type UsageError struct {
	Input   *Error
	Message string
}

func (e *UsageError) Error() string {
	if e.Input != nil {
		return strings.TrimSuffix(e.Input.Lines(), "\n")
	}
	return e.Message
}

func (e *UsageError) Unwrap() error {
	if e.Input == nil {
		return nil
	}
	return e.Input
}
