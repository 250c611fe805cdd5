package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestCreateBundleIsFoundAfterRuncsGlobalFlags(t *testing.T) {
	args := []string{"--root", "/r", "--log", "/l.json", "--log-format", "json", "--systemd-cgroup",
		"create", "--bundle", "/b/1", "--pid-file", "/b/1/init.pid", "id1"}
	if b, ok := createBundle(args); !ok || b != "/b/1" {
		t.Fatalf("got %q %v", b, ok)
	}
	if _, ok := createBundle([]string{"--root", "/r", "start", "id1"}); ok {
		t.Fatal("start is not create")
	}
	// A flag value spelled "create" is not the command.
	if _, ok := createBundle([]string{"--log", "create", "delete", "id1"}); ok {
		t.Fatal("a flag's value is not the command")
	}
}

func TestVisibleDevicesAreIndicesOrUUIDs(t *testing.T) {
	c := &Config{GPUs: []GPU{{UUID: "GPU-a", Device: "/dev/nvidia0"}, {UUID: "GPU-b", Device: "/dev/nvidia1"}}}
	for value, want := range map[string][]int{"all": {0, 1}, "none": nil, "1": {1}, "GPU-b,0": {1, 0}, "0,0": {0}} {
		got, err := c.visible(value)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: got %v %v, want %v", value, got, err, want)
		}
	}
	for _, bad := range []string{"2", "GPU-c", "-1"} {
		if _, err := c.visible(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestABundleAskingForAGPUGetsTheSimulator(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	for _, f := range []string{lib, filepath.Join(dir, "state"), filepath.Join(dir, "node.toml")} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs/usr/lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := &Config{
		Runc: "/bin/true", Libraries: []string{lib},
		State: filepath.Join(dir, "state"), Node: filepath.Join(dir, "node.toml"),
		Control: "/dev/null", UVM: "/dev/zero",
		GPUs: []GPU{{UUID: "GPU-a", Device: "/dev/full"}, {UUID: "GPU-b", Device: "/dev/full"}},
	}
	write := func(env ...string) {
		spec := specs.Spec{Root: &specs.Root{Path: "rootfs"}, Process: &specs.Process{Env: env}}
		data, _ := json.Marshal(spec)
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func() specs.Spec {
		var s specs.Spec
		data, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	for _, env := range [][]string{{"PATH=/bin"}, {"NVIDIA_VISIBLE_DEVICES="}, {"NVIDIA_VISIBLE_DEVICES=void"}} {
		write(env...)
		if changed, err := modifyBundle(cfg, bundle); err != nil || changed != "" {
			t.Fatalf("%v: changed %q, %v", env, changed, err)
		}
		if s := read(); len(s.Mounts) != 0 || s.Linux != nil {
			t.Fatalf("%v: the bundle changed: %+v", env, s)
		}
	}

	write("NVIDIA_VISIBLE_DEVICES=1", "GPUSIM_STATE=/elsewhere")
	if _, err := modifyBundle(cfg, bundle); err != nil {
		t.Fatal(err)
	}
	s := read()
	dests := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		dests[m.Destination] = m
	}
	if m, ok := dests["/usr/lib64/libcuda.so.1"]; !ok || m.Source != lib || !slices.Contains(m.Options, "ro") {
		t.Errorf("no read-only libcuda in the image's library folder: %+v", s.Mounts)
	}
	if _, ok := dests[stateInContainer]; !ok {
		t.Errorf("no state file: %+v", s.Mounts)
	}
	if !slices.Contains(s.Process.Env, "GPUSIM_STATE="+stateInContainer) || slices.Contains(s.Process.Env, "GPUSIM_STATE=/elsewhere") {
		t.Errorf("env %v", s.Process.Env)
	}
	var paths []string
	for _, d := range s.Linux.Devices {
		paths = append(paths, d.Path)
	}
	if !slices.Equal(paths, []string{"/dev/null", "/dev/zero", "/dev/full"}) {
		t.Errorf("devices %v", paths)
	}
	if len(s.Linux.Resources.Devices) != 3 || *s.Linux.Resources.Devices[2].Minor != 7 {
		t.Errorf("device rules %+v", s.Linux.Resources.Devices)
	}

	write("NVIDIA_VISIBLE_DEVICES=7")
	if _, err := modifyBundle(cfg, bundle); err == nil {
		t.Fatal("an unknown GPU was accepted")
	}
}

func TestTheLibraryFolderIsOneTheImageHas(t *testing.T) {
	root := t.TempDir()
	if got := chooseLibDir(root); got != "/usr/lib" {
		t.Errorf("empty image: %s", got)
	}
	if err := os.MkdirAll(filepath.Join(root, "lib/x86_64-linux-gnu"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := chooseLibDir(root); got != "/lib/x86_64-linux-gnu" {
		t.Errorf("debian-like image: %s", got)
	}
}

func TestTheCDISpecIsOneContainerdAccepts(t *testing.T) {
	dir := t.TempDir()
	cfg := &Config{
		Runc: "/bin/true", Libraries: []string{"/lib/cuda/libcuda.so.1"},
		State: "/s/state", Node: "/s/node.toml",
		Control: "/dev/null", UVM: "/dev/zero",
		GPUs: []GPU{{UUID: "GPU-5e1a0000-0000-4000-8000-000051510000", Device: "/dev/full"}, {UUID: "GPU-5e1a0000-0000-4000-8000-000051510001", Device: "/dev/random"}},
	}
	data, _ := json.Marshal(cfg)
	configFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(configFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	specDir := filepath.Join(dir, "cdi")
	if err := run([]string{"gpusim-container-runtime", "cdi", "--config", configFile, "--output", filepath.Join(specDir, "nvidia.com-gpu.json")}); err != nil {
		t.Fatal(err)
	}
	// containerd's own CDI library reads and applies it.
	cache, err := cdilib.NewCache(cdilib.WithSpecDirs(specDir), cdilib.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("spec errors: %v", errs)
	}
	want := []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-5e1a0000-0000-4000-8000-000051510000", "nvidia.com/gpu=GPU-5e1a0000-0000-4000-8000-000051510001", "nvidia.com/gpu=all"}
	if got := cache.ListDevices(); !slices.Equal(got, want) {
		t.Errorf("devices %v", got)
	}
	spec := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	if _, err := cache.InjectDevices(spec, "nvidia.com/gpu=GPU-5e1a0000-0000-4000-8000-000051510001"); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, d := range spec.Linux.Devices {
		paths = append(paths, d.Path)
	}
	slices.Sort(paths)
	if !slices.Equal(paths, []string{"/dev/null", "/dev/random", "/dev/zero"}) {
		t.Errorf("devices %v", paths)
	}
	var mounts []string
	for _, m := range spec.Mounts {
		mounts = append(mounts, m.Destination)
	}
	if !slices.Contains(mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.1") || !slices.Contains(mounts, stateInContainer) {
		t.Errorf("mounts %v", mounts)
	}
	if !slices.Contains(spec.Process.Env, "GPUSIM_STATE="+stateInContainer) {
		t.Errorf("env %v", spec.Process.Env)
	}
}
