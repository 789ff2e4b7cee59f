// Command images builds the images described in internal/images without a container daemon.
//
//	images build [--bin bin] [--platforms 'linux/amd64 linux/arm64'] [--out bin/images] [--tag TAG] [--epoch SECONDS] [NAME...]
//	    OCI image archives, one per image, each an index of every platform: OUT/NAME.tar (all
//	    images when no NAME is given), from the binaries in BIN/OS-ARCH
//	images rootfs --image NAME [--bin bin] --out DIR [--epoch SECONDS]
//	    the image's file system in DIR (the Dockerfiles' build stage runs this)
//	images dockerfiles [--out deploy/docker]
//	    writes the Dockerfiles generated from the same description
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kubemesh/proxy-init/internal/images"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "images: "+err.Error())
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("want a command: build, rootfs or dockerfiles")
	}
	fs := pflag.NewFlagSet(args[0], pflag.ContinueOnError)
	bin := fs.String("bin", "bin", "directory of the built binaries (make build)")
	out := fs.String("out", "", "output directory")
	tag := fs.String("tag", "dev", "image tag")
	image := fs.String("image", "", "image name (rootfs)")
	epoch := fs.Int64("epoch", 0, "modification and creation time, in seconds since 1970 (SOURCE_DATE_EPOCH)")
	platforms := fs.String("platforms", strings.Join(images.Platforms, " "), "platforms to build, separated by spaces or commas; the binaries of each are in BIN/OS-ARCH (make platform-bins)")
	debCache := fs.String("deb-cache", images.DefaultDebCache, "where the Debian packages and the private apt state are kept")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	in := images.Inputs{BinDir: *bin, RepoDir: ".", DebCache: *debCache, Epoch: time.Unix(*epoch, 0).UTC()}
	plats := strings.FieldsFunc(*platforms, func(r rune) bool { return r == ' ' || r == ',' })
	switch args[0] {
	case "build":
		dir := *out
		if dir == "" {
			dir = filepath.Join("bin", "images")
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
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
			dst := filepath.Join(dir, img.Name+".tar")
			if _, err := images.BuildOCI(dst, img, *tag, plats, in); err != nil {
				return err
			}
			fmt.Printf("%s\t%s\n", dst, img.Ref(*tag))
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
		dir := *out
		if dir == "" {
			dir = filepath.Join("deploy", "docker")
		}
		for _, img := range append(append([]images.Image{}, images.Images...), images.Overlay) {
			if err := os.WriteFile(filepath.Join(dir, img.Name+".Dockerfile"), []byte(images.Dockerfile(img)), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown command %q; want build, rootfs or dockerfiles", args[0])
}
