package doclinks

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

var (
	// link matches an inline link or image, capturing its target (without an optional title).
	link = regexp.MustCompile(`\[[^\]]*\]\(\s*([^)\s]+)(?:\s+"[^"]*")?\s*\)`)
	// codeSpan is inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// scheme marks an absolute URL (https:, mailto:), which is not checked.
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// heading is an ATX heading; its text is group 1.
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// Check returns one problem per broken relative link in the Markdown files (paths relative to
// root): a target that does not exist, or an anchor that names no heading of its page.
func Check(root string, files []string) ([]string, error) {
	anchors := map[string]map[string]bool{} // page (relative to root) -> its anchors
	anchorsOf := func(page string) (map[string]bool, error) {
		if a, ok := anchors[page]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			return nil, err
		}
		a := Anchors(string(b))
		anchors[page] = a
		return a, nil
	}
	var problems []string
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		for _, l := range Links(string(b)) {
			if scheme.MatchString(l.Target) {
				continue
			}
			bad := func(reason string) {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: %s", f, l.Line, l.Target, reason))
			}
			target, anchor, _ := strings.Cut(l.Target, "#")
			if p, err := url.PathUnescape(target); err == nil {
				target = p
			}
			page := f
			if target != "" {
				page = filepath.Join(filepath.Dir(f), target)
				if rel, err := filepath.Rel(root, filepath.Join(root, page)); err != nil || strings.HasPrefix(rel, "..") {
					bad("points outside the repository")
					continue
				}
				if _, err := os.Stat(filepath.Join(root, page)); err != nil {
					bad("no such file or directory")
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(page, ".md") {
				bad("an anchor into a file that is not Markdown")
				continue
			}
			a, err := anchorsOf(page)
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", page, err)
			}
			if !a[anchor] {
				bad(fmt.Sprintf("%s has no heading with the anchor #%s", page, anchor))
			}
		}
	}
	return problems, nil
}

// Link is one link target and the line it is on.
type Link struct {
	Target string
	Line   int
}

// Links returns the inline link targets of a Markdown text, outside fenced code blocks and code
// spans.
func Links(md string) []Link {
	var out []Link
	fenced := false
	for i, line := range strings.Split(md, "\n") {
		if isFence(line) {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, "``"), -1) {
			out = append(out, Link{Target: m[1], Line: i + 1})
		}
	}
	return out
}

// Anchors returns the anchors GitHub gives the headings of a Markdown text: the heading's text
// without markup, lower-cased, with spaces as hyphens and other punctuation dropped; a repeated
// anchor gets -1, -2... appended.
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if isFence(line) {
			fenced = !fenced
			continue
		}
		m := heading.FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		slug := Slug(m[1])
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// Slug is the anchor GitHub derives from a heading's text.
func Slug(text string) string {
	// A link in a heading contributes its text only.
	text = link.ReplaceAllStringFunc(text, func(s string) string { return s[1:strings.Index(s, "](")] })
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isFence(line string) bool {
	t := strings.TrimSpace(line)
	return strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")
}
