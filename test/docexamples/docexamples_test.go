package docexamples

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/test/cnitest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// example is one marked block.
type example struct {
	file  string
	line  int
	netns string   // the namespace path as the page writes it
	setup []string // commands run first, not shown
	exit  int
	steps []step
	// of names the program whose output the block is an excerpt of ("make demo"); the block
	// then holds no commands.
	of string
}

type step struct {
	command string
	output  string
}

var (
	marker = regexp.MustCompile(`^<!-- run:(.*)-->$`)
	attr   = regexp.MustCompile(`(\w+)=(?:"([^"]*)"|(\S+))`)
)

// examples returns the marked blocks of a Markdown page.
func examples(file, text string) ([]example, error) {
	lines := strings.Split(text, "\n")
	var out []example
	for i := 0; i < len(lines); i++ {
		m := marker.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		ex := example{file: file, line: i + 1}
		for _, a := range attr.FindAllStringSubmatch(m[1], -1) {
			v := a[2] + a[3]
			switch a[1] {
			case "netns":
				ex.netns = v
			case "setup":
				ex.setup = append(ex.setup, v)
			case "of":
				if v != "make demo" {
					return nil, fmt.Errorf("%s:%d: of=%q: only an excerpt of make demo runs", file, i+1, v)
				}
				ex.of = v
			case "exit":
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: exit=%q is not a number", file, i+1, v)
				}
				ex.exit = n
			default:
				return nil, fmt.Errorf("%s:%d: unknown attribute %q", file, i+1, a[1])
			}
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("%s:%d: a run marker must stand right before a fenced block", file, i+1)
		}
		var body []string
		for i += 2; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		if ex.of != "" {
			ex.steps = []step{{command: ex.of, output: strings.Join(body, "\n") + "\n"}}
			out = append(out, ex)
			continue
		}
		for j := 0; j < len(body); j++ {
			l := body[j]
			cmd, ok := strings.CutPrefix(l, "$ ")
			switch {
			case ok:
				for strings.HasSuffix(cmd, " \\") && j+1 < len(body) {
					j++
					cmd = strings.TrimSuffix(cmd, "\\") + strings.TrimSpace(body[j])
				}
				ex.steps = append(ex.steps, step{command: cmd})
			case len(ex.steps) == 0:
				return nil, fmt.Errorf("%s:%d: a run block starts with a command ($ ...)", file, ex.line)
			default:
				ex.steps[len(ex.steps)-1].output += l + "\n"
			}
		}
		// A blank line between one command's output and the next command is the page's layout.
		for i := range ex.steps {
			if o := strings.TrimRight(ex.steps[i].output, "\n"); o != "" {
				ex.steps[i].output = o + "\n"
			}
		}
		out = append(out, ex)
	}
	return out, nil
}

// volatile are what differs from run to run, and is compared as "...".
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\btime=\S+`), "time=..."},
	{regexp.MustCompile(`\bduration=\S+`), "duration=..."},
	{regexp.MustCompile(`(connection from \S+):\d+`), "$1:..."},
}

func normalize(s string) string {
	for _, v := range volatile {
		s = v.re.ReplaceAllString(s, v.with)
	}
	return s
}

// pattern turns a page's output into a regexp: "..." matches any text within a line, and a line
// of only "..." any number of lines.
func pattern(want string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`\A`)
	for _, l := range strings.SplitAfter(want, "\n") {
		if l == "" {
			continue
		}
		if strings.TrimSpace(l) == "..." {
			b.WriteString(`(?:[^\n]*\n)*?`)
			continue
		}
		parts := strings.Split(l, "...")
		for i, p := range parts {
			if i > 0 {
				b.WriteString(`[^\n]*?`)
			}
			b.WriteString(regexp.QuoteMeta(p))
		}
	}
	b.WriteString(`\z`)
	return regexp.MustCompile(b.String())
}

// pages are the Markdown files whose examples run.
func pages(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

// TestDocExamples runs every marked example of the documentation and compares its output.
func TestDocExamples(t *testing.T) {
	nt.RequireRoot(t, "the examples write rules into network namespaces")
	root := filepath.Join("..", "..")
	var all []example
	for _, f := range pages(t, root) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		exs, err := examples(f, string(b))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, exs...)
	}
	if len(all) == 0 {
		t.Fatal("no marked example in the documentation")
	}
	bin := t.TempDir()
	if err := cnitest.GoBuild(bin, "github.com/kubemesh/proxy-init/cmd/proxy-init"); err != nil {
		t.Fatal(err)
	}
	for _, ex := range all {
		t.Run(fmt.Sprintf("%s:%d", ex.file, ex.line), func(t *testing.T) {
			if ex.of != "" {
				ex.excerpt(t, root)
				return
			}
			ex.run(t, bin)
		})
	}
}

// excerpt runs make demo's script and finds the block in its output.
func (ex example) excerpt(t *testing.T, root string) {
	cmd := exec.Command("bash", filepath.Join("hack", "demo.sh"))
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}
	if want := ex.steps[0].output; !pattern(normalize("...\n" + want + "...\n")).MatchString(normalize(string(out))) {
		t.Errorf("make demo printed:\n%s\nwhich holds no %s:%d:\n%s", out, ex.file, ex.line, want)
	}
}

func (ex example) run(t *testing.T, bin string) {
	n := nt.NewNS(t)
	exec1 := func(command string) (string, int) {
		if ex.netns != "" {
			command = strings.ReplaceAll(command, ex.netns, n.Path())
		}
		args := strings.Fields(command)
		if len(args) == 0 || args[0] != "proxy-init" {
			t.Fatalf("%s:%d: %q: examples run proxy-init only", ex.file, ex.line, command)
		}
		var out bytes.Buffer
		err := n.Do(func() error {
			cmd := exec.Command(filepath.Join(bin, "proxy-init"), args[1:]...)
			cmd.Stdout, cmd.Stderr = &out, &out
			return cmd.Run()
		})
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", command, err)
		}
		got := out.String()
		if ex.netns != "" {
			got = strings.ReplaceAll(got, n.Path(), ex.netns)
		}
		return got, code
	}
	for _, s := range ex.setup {
		if out, code := exec1(s); code != 0 {
			t.Fatalf("setup %q: exit %d\n%s", s, code, out)
		}
	}
	for _, s := range ex.steps {
		got, code := exec1(s.command)
		if code != ex.exit {
			t.Errorf("$ %s\nexit %d, the page expects %d; output:\n%s", s.command, code, ex.exit, got)
		}
		if !pattern(normalize(s.output)).MatchString(normalize(got)) {
			t.Errorf("$ %s\nprinted:\n%s\nthe page shows (%s:%d):\n%s", s.command, got, ex.file, ex.line, s.output)
		}
	}
}
