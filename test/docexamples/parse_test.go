package docexamples

import (
	"slices"
	"testing"
)

// The page's output matches the run's where only what "..." stands for, or a volatile value,
// differs, and nowhere else: a page that drifts fails.
func TestPattern(t *testing.T) {
	const page = "time=... level=INFO msg=\"rules applied\" backend=iptables-nft changed=true duration=...\n...\nwhole: yes\n"
	for _, c := range []struct {
		got   string
		match bool
	}{
		{"time=2026-01-02T03:04:05Z level=INFO msg=\"rules applied\" backend=iptables-nft changed=true duration=1.2ms\nwhole: yes\n", true},
		{"time=x level=INFO msg=\"rules applied\" backend=iptables-nft changed=true duration=3s\na\nb\nwhole: yes\n", true},
		{"time=x level=INFO msg=\"rules applied\" backend=nftables changed=true duration=3s\nwhole: yes\n", false},
		{"time=x level=INFO msg=\"rules applied\" backend=iptables-nft changed=true duration=3s\nwhole: yes\nmore\n", false},
		{"time=x level=INFO msg=\"rules applied\" backend=iptables-nft changed=true duration=3s\n", false},
	} {
		if got := pattern(normalize(page)).MatchString(normalize(c.got)); got != c.match {
			t.Errorf("%q matches the page: %t, want %t", c.got, got, c.match)
		}
	}
}

func TestExamplesParse(t *testing.T) {
	const page = "text\n<!-- run: netns=/run/netns/pod setup=\"proxy-init a b\" setup=\"proxy-init c\" exit=1 -->\n```\n" +
		"$ proxy-init show \\\n  --netns /run/netns/pod\nline 1\n\n$ proxy-init version\nv\n```\n"
	exs, err := examples("page.md", page)
	if err != nil {
		t.Fatal(err)
	}
	want := example{file: "page.md", line: 2, netns: "/run/netns/pod", setup: []string{"proxy-init a b", "proxy-init c"}, exit: 1,
		steps: []step{{"proxy-init show --netns /run/netns/pod", "line 1\n"}, {"proxy-init version", "v\n"}}}
	if len(exs) != 1 || !equal(exs[0], want) {
		t.Errorf("examples = %+v\nwant %+v", exs, want)
	}
	for _, bad := range []string{
		"<!-- run: netns=x -->\ntext\n",
		"<!-- run: colour=red -->\n```\n$ proxy-init\n```\n",
		"<!-- run: exit=one -->\n```\n$ proxy-init\n```\n",
		"<!-- run: -->\n```\noutput first\n```\n",
	} {
		if _, err := examples("page.md", bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func equal(a, b example) bool {
	return a.file == b.file && a.line == b.line && a.netns == b.netns && slices.Equal(a.setup, b.setup) && a.exit == b.exit && slices.Equal(a.steps, b.steps)
}
