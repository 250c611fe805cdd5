// Command oci-image writes a one-layer OCI image, as an OCI image layout in
// a tar archive that `ctr images import` reads, from files of this
// machine. The cluster has no registry: every image it runs is made so.
//
//	oci-image --name registry.k8s.io/pause:3.10.2 --out pause.tar \
//	    --add target/cluster/bin/pause=/pause --entrypoint /pause
//
// The archive is reproducible: the same files give the same digests (every
// time stamp is the epoch), so importing it again changes nothing.
package main

import (
	"archive/tar"
	"bytes"
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
	var adds addFlag
	flags.Var(&adds, "add", "SRC=DEST: a file of this machine and its absolute path in the image (repeatable)")
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

	layer, err := layerTar(files)
	if err != nil {
		return err
	}
	layerDigest := digest(layer)

	imageConfig := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Env":        []string{"PATH=/usr/local/bin:/usr/bin:/bin:/"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{layerDigest},
		},
	}
	if *entrypoint != "" {
		imageConfig["config"].(map[string]any)["Entrypoint"] = []string{*entrypoint}
	}
	configJSON, err := json.Marshal(imageConfig)
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: digest(configJSON), Size: int64(len(configJSON))},
		"layers":        []descriptor{{MediaType: mediaLayer, Digest: layerDigest, Size: int64(len(layer))}},
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

// layerTar is the layer: every parent folder of the files, then the files,
// in name order.
func layerTar(files []file) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range files {
		for dir := path.Dir(f.dest); dir != "/"; dir = path.Dir(dir) {
			dirs[dir] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for dir := range dirs {
		dirList = append(dirList, dir)
	}
	sort.Strings(dirList)
	sort.Slice(files, func(i, j int) bool { return files[i].dest < files[j].dest })

	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, dir := range dirList {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(dir, "/") + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := writeFile(w, strings.TrimPrefix(f.dest, "/"), f.mode, f.data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
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
