// Command oci-image writes a one-layer OCI image, as an OCI image layout in
// a tar archive that `ctr images import` reads, from files of this
// machine. The cluster has no registry: every image it runs is made so.
//
//	oci-image --name registry.k8s.io/pause:3.10.2 --out pause.tar \
//	    --add target/cluster/bin/pause=/pause --entrypoint /pause
//
// Besides files, the layer may hold symbolic links (--link
// /bin/sh=busybox) and empty folders (--dir /tmp=1777); the image's
// configuration may name its environment (--env, which replaces the
// default PATH when it names PATH), user (--user 65532) and labels
// (--label). With --gzip the layer is stored gzip-compressed (as
// registries serve it); without, as a plain tar.
//
// The archive is reproducible: the same files give the same digests (every
// time stamp is the epoch), so importing it again changes nothing.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

type addFlag []string

func (a *addFlag) String() string     { return strings.Join(*a, ",") }
func (a *addFlag) Set(v string) error { *a = append(*a, v); return nil }

// file is one regular file of the layer.
type file struct {
	dest string // absolute path in the image
	mode int64
	data []byte
}

// link is one symbolic link of the layer.
type link struct {
	dest   string // absolute path in the image
	target string // as given: relative to the link's folder, or absolute
}

// dir is one folder of the layer named by --dir, with its mode.
type dir struct {
	dest string
	mode int64
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
	defaultPath   = "PATH=/usr/local/bin:/usr/bin:/bin:/"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "oci-image: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	flags := flag.NewFlagSet("oci-image", flag.ContinueOnError)
	name := flags.String("name", "", "full image name, e.g. registry.k8s.io/pause:3.10.2")
	out := flags.String("out", "", "the tar archive to write")
	entrypoint := flags.String("entrypoint", "", "the image's entrypoint, a path in the image")
	user := flags.String("user", "", "the image's user, e.g. 65532 or 65532:65532 (default: root)")
	gzipLayer := flags.Bool("gzip", false, "store the layer gzip-compressed")
	var adds, links, dirs, envs, labels addFlag
	flags.Var(&adds, "add", "SRC=DEST: a file of this machine and its absolute path in the image (repeatable)")
	flags.Var(&links, "link", "DEST=TARGET: a symbolic link at the absolute path DEST to TARGET (repeatable)")
	flags.Var(&dirs, "dir", "DEST or DEST=MODE: an empty folder, mode in octal (default 755; repeatable)")
	flags.Var(&envs, "env", "NAME=VALUE: an environment variable of the image (repeatable)")
	flags.Var(&labels, "label", "KEY=VALUE: a label of the image's configuration (repeatable)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flags.Args())
	}
	if *name == "" || *out == "" || len(adds) == 0 {
		return errors.New("--name, --out and at least one --add are required")
	}
	tag := "latest"
	if colon := strings.LastIndex(*name, ":"); colon > strings.LastIndex(*name, "/") {
		tag = (*name)[colon+1:]
	}

	var files []file
	for _, add := range adds {
		src, dest, ok := strings.Cut(add, "=")
		if !ok || src == "" || !path.IsAbs(dest) {
			return fmt.Errorf("bad --add %q: expected SRC=/absolute/dest", add)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("cannot read %s: %w", src, err)
		}
		info, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("cannot stat %s: %w", src, err)
		}
		files = append(files, file{dest: path.Clean(dest), mode: int64(info.Mode().Perm()), data: data})
	}
	var linkList []link
	for _, l := range links {
		dest, target, ok := strings.Cut(l, "=")
		if !ok || target == "" || !path.IsAbs(dest) || path.Clean(dest) == "/" {
			return fmt.Errorf("bad --link %q: expected /absolute/dest=TARGET", l)
		}
		linkList = append(linkList, link{dest: path.Clean(dest), target: target})
	}
	var dirList []dir
	for _, d := range dirs {
		dest, modeText, hasMode := strings.Cut(d, "=")
		mode := int64(0o755)
		if hasMode {
			m, err := strconv.ParseInt(modeText, 8, 64)
			if err != nil || m < 0 || m > 0o7777 {
				return fmt.Errorf("bad --dir %q: the mode is not octal 0 to 7777", d)
			}
			mode = m
		}
		if !path.IsAbs(dest) || path.Clean(dest) == "/" {
			return fmt.Errorf("bad --dir %q: expected /absolute/dest or /absolute/dest=MODE", d)
		}
		dirList = append(dirList, dir{dest: path.Clean(dest), mode: mode})
	}
	env := []string{defaultPath}
	for _, e := range envs {
		key, _, ok := strings.Cut(e, "=")
		if !ok || key == "" {
			return fmt.Errorf("bad --env %q: expected NAME=VALUE", e)
		}
		if key == "PATH" {
			env[0] = e
		} else {
			env = append(env, e)
		}
	}
	labelMap := map[string]string{}
	for _, l := range labels {
		key, value, ok := strings.Cut(l, "=")
		if !ok || key == "" {
			return fmt.Errorf("bad --label %q: expected KEY=VALUE", l)
		}
		labelMap[key] = value
	}

	layer, err := layerTar(files, linkList, dirList)
	if err != nil {
		return err
	}
	diffID := digest(layer)
	layerMedia := mediaLayer
	if *gzipLayer {
		if layer, err = compress(layer); err != nil {
			return err
		}
		layerMedia = mediaLayerGz
	}
	layerDigest := digest(layer)

	imageConfig := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Env":        env,
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{diffID},
		},
	}
	if *entrypoint != "" {
		imageConfig["config"].(map[string]any)["Entrypoint"] = []string{*entrypoint}
	}
	if *user != "" {
		imageConfig["config"].(map[string]any)["User"] = *user
	}
	if len(labelMap) > 0 {
		imageConfig["config"].(map[string]any)["Labels"] = labelMap
	}
	configJSON, err := json.Marshal(imageConfig)
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: digest(configJSON), Size: int64(len(configJSON))},
		"layers":        []descriptor{{MediaType: layerMedia, Digest: layerDigest, Size: int64(len(layer))}},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests": []descriptor{{
			MediaType: mediaManifest,
			Digest:    digest(manifestJSON),
			Size:      int64(len(manifestJSON)),
			Annotations: map[string]string{
				"io.containerd.image.name":          *name,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: runtime.GOARCH, OS: "linux"},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	var archive bytes.Buffer
	w := tar.NewWriter(&archive)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", indexJSON},
	}
	for _, blob := range [][]byte{layer, configJSON, manifestJSON} {
		entries = append(entries, struct {
			name string
			data []byte
		}{"blobs/sha256/" + strings.TrimPrefix(digest(blob), "sha256:"), blob})
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
	}
	for _, e := range entries {
		if err := writeFile(w, e.name, 0o644, e.data); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(*out, archive.Bytes(), 0o644); err != nil {
		return fmt.Errorf("cannot write %s: %w", *out, err)
	}
	fmt.Printf("%s %s\n", *name, digest(manifestJSON))
	return nil
}

// layerTar is the layer: every folder (named by --dir, or a parent of an
// entry), then the files and links, in name order. A path named twice, or
// an entry below a link, is an error: the layer would be ambiguous.
func layerTar(files []file, links []link, named []dir) ([]byte, error) {
	kinds := map[string]string{}
	claim := func(dest, kind string) error {
		if prev, ok := kinds[dest]; ok {
			return fmt.Errorf("%s is named twice (as a %s and as a %s)", dest, prev, kind)
		}
		kinds[dest] = kind
		return nil
	}
	for _, f := range files {
		if err := claim(f.dest, "file"); err != nil {
			return nil, err
		}
	}
	for _, l := range links {
		if err := claim(l.dest, "link"); err != nil {
			return nil, err
		}
	}
	dirModes := map[string]int64{}
	for _, d := range named {
		if err := claim(d.dest, "folder"); err != nil {
			return nil, err
		}
		dirModes[d.dest] = d.mode
	}
	for dest := range kinds {
		for parent := path.Dir(dest); parent != "/"; parent = path.Dir(parent) {
			switch kinds[parent] {
			case "file", "link":
				return nil, fmt.Errorf("%s is below %s, which is a %s", dest, parent, kinds[parent])
			}
			if _, ok := dirModes[parent]; !ok {
				dirModes[parent] = 0o755
			}
		}
	}
	dirList := make([]string, 0, len(dirModes))
	for d := range dirModes {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	sort.Slice(files, func(i, j int) bool { return files[i].dest < files[j].dest })
	sort.Slice(links, func(i, j int) bool { return links[i].dest < links[j].dest })

	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, d := range dirList {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: dirModes[d], ModTime: time.Unix(0, 0)}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := writeFile(w, strings.TrimPrefix(f.dest, "/"), f.mode, f.data); err != nil {
			return nil, err
		}
	}
	for _, l := range links {
		hdr := &tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(l.dest, "/"), Linkname: l.target, Mode: 0o777, ModTime: time.Unix(0, 0)}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// compress gzips the layer reproducibly: no name, no time stamp.
func compress(layer []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(layer); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeFile(w *tar.Writer, name string, mode int64, data []byte) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}
	if err := w.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := w.Write(data)
	return err
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
