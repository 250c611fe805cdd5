// Command gpusim-container-runtime is the simulated node's counterpart of
// NVIDIA's container runtime: an OCI runtime that containerd runs in place
// of runc. On `create` it reads the bundle's config.json and, when the
// container's process asks for GPUs through NVIDIA_VISIBLE_DEVICES (set,
// and neither empty nor "void"), adds what a GPU container needs to run an
// unmodified CUDA program on the simulated GPUs:
//
//   - the simulator's libcuda.so.1 and libnvidia-ml.so.1, bound read-only
//     into a folder the image's dynamic loader searches by default
//     (/usr/lib/x86_64-linux-gnu, /lib/x86_64-linux-gnu, /usr/lib64 or
//     /usr/lib, the first the image has; /usr/lib otherwise, which glibc
//     and musl both search);
//   - the simulator's shared state file and node description, bound at
//     /run/gpusim/, with GPUSIM_STATE and GPUSIM_NODE naming them;
//   - the stand-in device nodes: /dev/nvidiactl, /dev/nvidia-uvm, and
//     /dev/nvidia<i> for each visible GPU ("all", indices or UUIDs; "none"
//     gives the libraries and no GPU), with a device-cgroup rule each.
//
// Then, for every command, it runs runc with the original arguments
// (exec: same pid, same exit status). Without the variable, or with
// "void", the bundle is left as it is.
//
// Its configuration is a JSON file beside the name it was started by
// (containerd starts it through a link under the cluster's run folder:
// config.json in that folder), or the file GPUSIM_RUNTIME_CONFIG names.
//
// `gpusim-container-runtime cdi --config FILE --output FILE` writes the
// same edits as a CDI spec (kind nvidia.com/gpu, devices by index, by
// UUID and "all"), the path that device plugins (cdi_devices) and DRA
// drivers take instead of the environment variable.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// visibleEnv is the variable that asks for GPUs, as NVIDIA's toolkit reads it.
const visibleEnv = "NVIDIA_VISIBLE_DEVICES"

// Where the state file and node description appear in a container.
const (
	stateInContainer = "/run/gpusim/state"
	nodeInContainer  = "/run/gpusim/node.toml"
)

// libDirs are the folders the libraries go to, by preference: the first
// that the image has.
var libDirs = []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"}

// Config is what `cargo xtask cluster up` writes for the runtime.
type Config struct {
	// Runc is the runtime that runs the containers.
	Runc string `json:"runc"`
	// Libraries are host files bound by base name into the library folder.
	Libraries []string `json:"libraries"`
	// State and Node are the simulator's state file and node description.
	State string `json:"state"`
	Node  string `json:"node"`
	// Control and UVM are the shared device nodes (host paths, the same in
	// the container).
	Control string `json:"control"`
	UVM     string `json:"uvm"`
	// GPUs in index order.
	GPUs []GPU `json:"gpus"`
	// Log, when set, gets one line per container changed.
	Log string `json:"log,omitempty"`
}

// GPU is one simulated GPU.
type GPU struct {
	UUID string `json:"uuid"`
	// Device is its device node, e.g. /dev/nvidia0.
	Device string `json:"device"`
}

func main() {
	if err := run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "gpusim-container-runtime: %v\n", err)
		os.Exit(1)
	}
}

func configPath(argv0 string) string {
	if p := os.Getenv("GPUSIM_RUNTIME_CONFIG"); p != "" {
		return p
	}
	return filepath.Join(filepath.Dir(argv0), "config.json")
}

func loadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the runtime configuration: %w", err)
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("runtime configuration %s is malformed: %w", path, err)
	}
	if c.Runc == "" {
		return nil, fmt.Errorf("runtime configuration %s names no runc", path)
	}
	return &c, nil
}

func run(args []string) error {
	if len(args) > 1 && args[1] == "cdi" {
		return generateCDI(args[2:])
	}
	cfg, err := loadConfig(configPath(args[0]))
	if err != nil {
		return err
	}
	if bundle, ok := createBundle(args[1:]); ok {
		changed, err := modifyBundle(cfg, bundle)
		if err != nil {
			return fmt.Errorf("bundle %s: %w", bundle, err)
		}
		if changed != "" {
			cfg.log(fmt.Sprintf("%s: %s", filepath.Base(bundle), changed))
		}
	}
	argv := append([]string{cfg.Runc}, args[1:]...)
	return syscall.Exec(cfg.Runc, argv, os.Environ())
}

func (c *Config) log(line string) {
	if c.Log == "" {
		return
	}
	f, err := os.OpenFile(c.Log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s\n", time.Now().UTC().Format(time.RFC3339), line)
}

// runcGlobalWithValue are runc's global flags that take a value.
var runcGlobalWithValue = map[string]bool{
	"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true,
}

// createBundle finds `create` among runc's arguments and its bundle
// (--bundle/-b, default the working folder).
func createBundle(args []string) (string, bool) {
	i := 0
	for i < len(args) {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			break
		}
		if runcGlobalWithValue[a] {
			i++
		}
		i++
	}
	if i >= len(args) || args[i] != "create" {
		return "", false
	}
	rest := args[i+1:]
	for j, a := range rest {
		switch {
		case (a == "--bundle" || a == "-b") && j+1 < len(rest):
			return rest[j+1], true
		case strings.HasPrefix(a, "--bundle="):
			return strings.TrimPrefix(a, "--bundle="), true
		case strings.HasPrefix(a, "-b="):
			return strings.TrimPrefix(a, "-b="), true
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return ".", true
	}
	return wd, true
}

// modifyBundle rewrites the bundle's config.json for a GPU container; it
// returns what it did ("" when the container asks for no GPU).
func modifyBundle(cfg *Config, bundle string) (string, error) {
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("config.json is malformed: %w", err)
	}
	if spec.Process == nil {
		return "", nil
	}
	value, set := lookupEnv(spec.Process.Env, visibleEnv)
	if !set || value == "" || value == "void" {
		return "", nil
	}
	gpus, err := cfg.visible(value)
	if err != nil {
		return "", err
	}
	rootfs := ""
	if spec.Root != nil {
		rootfs = spec.Root.Path
		if !filepath.IsAbs(rootfs) {
			rootfs = filepath.Join(bundle, rootfs)
		}
	}
	libDir := chooseLibDir(rootfs)
	if err := inject(cfg, &spec, libDir, gpus); err != nil {
		return "", err
	}
	out, err := json.Marshal(&spec)
	if err != nil {
		return "", err
	}
	if err := writeReplacing(path, out); err != nil {
		return "", err
	}
	indices := make([]string, len(gpus))
	for i, g := range gpus {
		indices[i] = strconv.Itoa(g)
	}
	return fmt.Sprintf("%s=%s: libraries in %s, gpus [%s]", visibleEnv, value, libDir, strings.Join(indices, ",")), nil
}

func lookupEnv(env []string, name string) (string, bool) {
	found, value := false, ""
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			found, value = true, v // the last one wins, as in execve's users
		}
	}
	return value, found
}

// visible turns the variable's value into GPU indices.
func (c *Config) visible(value string) ([]int, error) {
	switch value {
	case "none":
		return nil, nil
	case "all":
		all := make([]int, len(c.GPUs))
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	var out []int
	for _, id := range strings.Split(value, ",") {
		id = strings.TrimSpace(id)
		index := -1
		if n, err := strconv.Atoi(id); err == nil && n >= 0 && n < len(c.GPUs) {
			index = n
		} else {
			for i, g := range c.GPUs {
				if strings.EqualFold(g.UUID, id) {
					index = i
				}
			}
		}
		if index < 0 {
			return nil, fmt.Errorf("%s=%s: no simulated GPU %q (the node has %d)", visibleEnv, value, id, len(c.GPUs))
		}
		if !slices.Contains(out, index) {
			out = append(out, index)
		}
	}
	return out, nil
}

// chooseLibDir picks the first of libDirs that the image has (a folder or
// a link, never followed: a link may point outside the root).
func chooseLibDir(rootfs string) string {
	if rootfs != "" {
		for _, dir := range libDirs {
			if info, err := os.Lstat(filepath.Join(rootfs, dir)); err == nil && (info.IsDir() || info.Mode()&os.ModeSymlink != 0) {
				return dir
			}
		}
	}
	return "/usr/lib"
}

func inject(cfg *Config, spec *specs.Spec, libDir string, gpus []int) error {
	bind := func(src, dst string, options ...string) {
		spec.Mounts = slices.DeleteFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == dst })
		spec.Mounts = append(spec.Mounts, specs.Mount{
			Destination: dst,
			Type:        "bind",
			Source:      src,
			Options:     append([]string{"rbind", "nosuid", "nodev"}, options...),
		})
	}
	for _, lib := range cfg.Libraries {
		if _, err := os.Stat(lib); err != nil {
			return fmt.Errorf("simulator library: %w", err)
		}
		bind(lib, filepath.Join(libDir, filepath.Base(lib)), "ro")
	}
	bind(cfg.State, stateInContainer, "rw", "noexec")
	bind(cfg.Node, nodeInContainer, "ro", "noexec")
	spec.Process.Env = setEnv(spec.Process.Env, "GPUSIM_STATE", stateInContainer)
	spec.Process.Env = setEnv(spec.Process.Env, "GPUSIM_NODE", nodeInContainer)

	devices := []string{cfg.Control, cfg.UVM}
	for _, g := range gpus {
		devices = append(devices, cfg.GPUs[g].Device)
	}
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	if spec.Linux.Resources == nil {
		spec.Linux.Resources = &specs.LinuxResources{}
	}
	for _, path := range devices {
		if path == "" {
			continue
		}
		dev, err := deviceOf(path)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(spec.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == path }) {
			spec.Linux.Devices = append(spec.Linux.Devices, dev)
		}
		major, minor := dev.Major, dev.Minor
		spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices, specs.LinuxDeviceCgroup{
			Allow:  true,
			Type:   "c",
			Major:  &major,
			Minor:  &minor,
			Access: "rwm",
		})
	}
	return nil
}

func setEnv(env []string, name, value string) []string {
	env = slices.DeleteFunc(env, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == name
	})
	return append(env, name+"="+value)
}

// deviceOf describes the character device at path (host and container).
func deviceOf(path string) (specs.LinuxDevice, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return specs.LinuxDevice{}, fmt.Errorf("stand-in device %s: %w", path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		return specs.LinuxDevice{}, fmt.Errorf("stand-in device %s is not a character device", path)
	}
	mode := os.FileMode(st.Mode & 0o777)
	uid, gid := uint32(0), uint32(0)
	return specs.LinuxDevice{
		Path:     path,
		Type:     "c",
		Major:    int64(major(st.Rdev)),
		Minor:    int64(minor(st.Rdev)),
		FileMode: &mode,
		UID:      &uid,
		GID:      &gid,
	}, nil
}

// major and minor decode a Linux dev_t (glibc's gnu_dev_major/minor).
func major(dev uint64) uint64 { return ((dev >> 8) & 0xfff) | ((dev >> 32) &^ 0xfff) }
func minor(dev uint64) uint64 { return (dev & 0xff) | ((dev >> 12) &^ 0xff) }

// writeReplacing writes path through a file beside it and a rename.
func writeReplacing(path string, data []byte) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".gpusim"
	if err := os.WriteFile(tmp, data, info.Mode().Perm()); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}
