// Command images builds the images described in tools/images without a container daemon,
// and publishes them (tools/release). `make tools-bin` builds it into bin/tools; run it from the
// repository root, whose paths (bin/, deploy/) it takes. Its commands (flags: COMMAND --help):
//
//	build [NAME...]  OCI image archives OUT/NAME.tar (all images without NAME), each an index of
//	                 every platform, from the binaries in BIN/OS-ARCH
//	overlay          Linkerd's proxy image (--base: a registry reference, an OCI layout or
//	                 archive) with our proxy-init and validator, every platform, pushed to --to
//	release          the release of --version vX.Y.Z: archives, SBOMs, the chart package,
//	                 SHA256SUMS; pushed (and signed) given --registry (and --key)
//	chart            the linkerd2-cni chart as a Helm package of --version (pushed given --registry)
//	rootfs           the --image's file system in --out (the Dockerfiles' build stage runs this)
//	dockerfiles      writes the Dockerfiles generated from the same description
//
// Registries are reached with the credentials of `docker login` (the docker config and its
// credential helpers); the chart's push uses Helm's, which fall back to Docker's.
// COSIGN_PASSWORD decrypts a cosign --key.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/pflag"

	"github.com/kubemesh/proxy-init/tools/chart"
	"github.com/kubemesh/proxy-init/tools/images"
	"github.com/kubemesh/proxy-init/tools/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "images: "+err.Error())
		os.Exit(1)
	}
}

const commands = "build, overlay, release, chart, rootfs or dockerfiles"

// defaultOut is each command's output directory when --out is not given (rootfs has none).
var defaultOut = map[string]string{
	"build":       filepath.Join("bin", "images"),
	"release":     filepath.Join("bin", "release"),
	"chart":       filepath.Join("bin", "chart"),
	"dockerfiles": filepath.Join("deploy", "docker"),
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("want a command: %s", commands)
	}
	fs := pflag.NewFlagSet(args[0], pflag.ContinueOnError)
	bin := fs.String("bin", "bin", "directory of the built binaries (make build; make platform-bins writes BIN/OS-ARCH)")
	out := fs.String("out", defaultOut[args[0]], "output directory")
	tag := fs.String("tag", "dev", "image tag")
	image := fs.String("image", "", "image name (rootfs)")
	epoch := fs.Int64("epoch", 0, "modification and creation time, in seconds since 1970 (SOURCE_DATE_EPOCH)")
	platforms := fs.String("platforms", strings.Join(images.Platforms, " "), "platforms, separated by spaces or commas")
	debCache := fs.String("deb-cache", images.DefaultDebCache, "where the Debian packages and the private apt state are kept")
	base := fs.String("base", "", "overlay: Linkerd's proxy image: a registry reference, or an OCI layout directory or archive")
	to := fs.String("to", "", "overlay: the registry reference to push the result to")
	version := fs.String("version", "", "release: vX.Y.Z; overlay: ours, for the layer's history")
	registry := fs.String("registry", "", "release: host[:port]/namespace to push to (nothing is pushed without it)")
	key := fs.String("key", "", "signing key (cosign's, or a PEM private key); COSIGN_PASSWORD decrypts a cosign key")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	in := images.Inputs{BinDir: *bin, RepoDir: ".", DebCache: *debCache, Epoch: time.Unix(*epoch, 0).UTC()}
	plats := strings.FieldsFunc(*platforms, func(r rune) bool { return r == ' ' || r == ',' })
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	keychain := []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	switch args[0] {
	case "build":
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		list := images.Images
		if fs.NArg() > 0 {
			list = nil
			for _, name := range fs.Args() {
				img, err := images.Find(name)
				if err != nil {
					return err
				}
				list = append(list, img)
			}
		}
		for _, img := range list {
			dst := filepath.Join(*out, img.Name+".tar")
			if _, err := images.BuildOCI(dst, img, *tag, plats, in); err != nil {
				return err
			}
			fmt.Printf("%s\t%s\n", dst, img.Ref(*tag))
		}
		return nil
	case "overlay":
		if *base == "" || *to == "" {
			return fmt.Errorf("overlay: --base and --to are required")
		}
		var signer *release.Signer
		if *key != "" {
			var err error
			if signer, err = release.LoadSigner(*key, []byte(os.Getenv("COSIGN_PASSWORD"))); err != nil {
				return err
			}
		}
		res, err := release.Overlay(ctx, release.OverlayOptions{
			Base: *base, Target: *to, BinDir: *bin, Platforms: plats, Epoch: in.Epoch, Version: *version, Remote: keychain,
		})
		if err != nil {
			return err
		}
		signed := []string{res.Ref.DigestStr()}
		for _, p := range res.Platforms {
			fmt.Printf("%s\t%s (base %s)\n", p.Platform.OS+"/"+p.Platform.Architecture, p.Digest, p.Base)
			signed = append(signed, p.Digest.String())
		}
		if len(res.Dropped) > 0 {
			fmt.Printf("left out %d attestation manifests of the base (they attest Linkerd's images, not these)\n", len(res.Dropped))
		}
		if signer != nil {
			for _, d := range signed {
				if _, err := signer.Sign(ctx, res.Ref.Context().Digest(d), keychain...); err != nil {
					return err
				}
			}
			fmt.Println("signed")
		}
		fmt.Printf("pushed %s\n", res.Ref)
		return nil
	case "release":
		res, err := release.Run(ctx, release.Options{
			Version: *version, BinDir: *bin, Platforms: plats, Out: *out, RepoDir: ".", DebCache: *debCache,
			Epoch: in.Epoch, Registry: *registry, KeyFile: *key, Password: []byte(os.Getenv("COSIGN_PASSWORD")),
			Remote: keychain, Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
		})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "IMAGE\tPLATFORM\tCOMPRESSED\tDIGEST")
		for _, r := range res.Images {
			fmt.Fprintf(tw, "%s\tindex\t\t%s\n", r.Ref, r.Digest)
			for _, p := range r.Platforms {
				fmt.Fprintf(tw, "\t%s\t%.1f MiB\t%s\n", p.Platform, float64(p.Size)/(1<<20), p.Digest)
			}
		}
		tw.Flush()
		fmt.Printf("chart %s\n", res.Chart)
		if res.ChartRef != "" {
			fmt.Printf("pushed chart %s\n", res.ChartRef)
		}
		fmt.Printf("checksums %s\n", res.Sums)
		return nil
	case "chart":
		pkg, err := chart.Package(".", *out, *version, "")
		if err != nil {
			return err
		}
		fmt.Println(pkg)
		if *registry != "" {
			ref, _, err := chart.Push(pkg, *registry, in.Epoch)
			if err != nil {
				return err
			}
			fmt.Printf("pushed oci://%s\n", ref)
		}
		return nil
	case "rootfs":
		img, err := images.Find(*image)
		if err != nil {
			return err
		}
		if *out == "" {
			return fmt.Errorf("rootfs: --out is required")
		}
		return images.WriteRootFS(*out, img, in)
	case "dockerfiles":
		for _, img := range append(slices.Clone(images.Images), images.Overlay) {
			if err := os.WriteFile(filepath.Join(*out, img.Name+".Dockerfile"), []byte(images.Dockerfile(img)), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown command %q; want %s", args[0], commands)
}
