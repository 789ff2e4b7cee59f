package validator

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/kubemesh/proxy-init/internal/logging"
)

// Main runs `proxy-init validate` with the arguments after "validate", writing help to stdout and
// logs to stderr, and returns the exit code (ExitCode).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := Parse(args)
	if errors.Is(err, ErrHelp) {
		fmt.Fprint(stdout, Usage())
		return ExitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "proxy-init validate: "+err.Error())
		return ExitCode(err)
	}
	f, _ := logging.ParseFilter(c.LogLevel, Target) // c is valid
	log := logging.New(stderr, c.LogFormat, f.Level)
	f.Log(log) // how a filter was read
	err = Run(ctx, c, log)
	code := ExitCode(err)
	switch code {
	case ExitOK:
		log.Info("validation passed: outbound TCP is redirected to the proxy port")
	case ExitRedirectFailed:
		log.Error("validation failed: the redirect does not work", "exit_code", code, "error", err.Error())
	default:
		log.Error("validator could not run", "exit_code", code, "error", err.Error())
	}
	return code
}
