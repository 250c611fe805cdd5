package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	cdi "tags.cncf.io/container-device-interface/specs-go"
)

// The CDI kind of the simulated GPUs: NVIDIA's, as `nvidia-ctk cdi
// generate` writes it, so that `nvidia.com/gpu=0`, `nvidia.com/gpu=<uuid>`
// and `nvidia.com/gpu=all` name them.
const (
	cdiKind    = "nvidia.com/gpu"
	cdiVersion = "0.6.0"
	// cdiLibDir is where the CDI path puts the libraries: a spec cannot
	// look into the image, so the folder of Debian's and Ubuntu's loader
	// (the CUDA base images'), which runc makes where it is missing.
	cdiLibDir = "/usr/lib/x86_64-linux-gnu"
)

// generateCDI writes the CDI spec of the simulated GPUs: per GPU its
// device node; for any of them the shared device nodes, the libraries,
// the state file and node description, and the GPUSIM_* variables.
func generateCDI(args []string) error {
	flags := flag.NewFlagSet("cdi", flag.ContinueOnError)
	configFile := flags.String("config", "", "the runtime configuration (JSON)")
	output := flags.String("output", "", "the CDI spec to write (JSON)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *configFile == "" || *output == "" || flags.NArg() > 0 {
		return fmt.Errorf("usage: gpusim-container-runtime cdi --config FILE --output FILE")
	}
	cfg, err := loadConfig(*configFile)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(cdiSpec(cfg), "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*output), 0o755); err != nil {
		return err
	}
	tmp := *output + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, *output)
}

func cdiSpec(cfg *Config) *cdi.Spec {
	spec := &cdi.Spec{Version: cdiVersion, Kind: cdiKind}
	var all []*cdi.DeviceNode
	for i, g := range cfg.GPUs {
		node := func() []*cdi.DeviceNode { return []*cdi.DeviceNode{{Path: g.Device}} }
		for _, name := range []string{strconv.Itoa(i), g.UUID} {
			spec.Devices = append(spec.Devices, cdi.Device{
				Name:           name,
				ContainerEdits: cdi.ContainerEdits{DeviceNodes: node()},
			})
		}
		all = append(all, node()...)
	}
	spec.Devices = append(spec.Devices, cdi.Device{Name: "all", ContainerEdits: cdi.ContainerEdits{DeviceNodes: all}})

	edits := &spec.ContainerEdits
	for _, path := range []string{cfg.Control, cfg.UVM} {
		if path != "" {
			edits.DeviceNodes = append(edits.DeviceNodes, &cdi.DeviceNode{Path: path})
		}
	}
	mount := func(host, container string, options ...string) {
		edits.Mounts = append(edits.Mounts, &cdi.Mount{
			HostPath:      host,
			ContainerPath: container,
			Type:          "bind",
			Options:       append([]string{"rbind", "nosuid", "nodev"}, options...),
		})
	}
	for _, lib := range cfg.Libraries {
		mount(lib, filepath.Join(cdiLibDir, filepath.Base(lib)), "ro")
	}
	mount(cfg.State, stateInContainer, "rw", "noexec")
	mount(cfg.Node, nodeInContainer, "ro", "noexec")
	edits.Env = []string{"GPUSIM_STATE=" + stateInContainer, "GPUSIM_NODE=" + nodeInContainer}
	return spec
}
