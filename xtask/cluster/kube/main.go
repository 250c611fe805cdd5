// Command tessera-kube is the Kubernetes of `cargo xtask cluster`: one
// binary, several programs, each run as a process of its own.
//
//	tessera-kube etcd [--data-dir DIR] [--client-url URL] [--peer-url URL]
//	tessera-kube kube-apiserver ARGS...
//	tessera-kube kube-controller-manager ARGS...
//	tessera-kube kube-scheduler ARGS...
//	tessera-kube kubelet ARGS...
//	tessera-kube kubectl ARGS...
//
// The program is the first argument, or the name the binary is called by
// (a link named kubectl runs kubectl). Each program is upstream's own
// command at the version go.mod pins, started as upstream's main starts it.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // CronJob time zones, as upstream's apiserver and controller-manager

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// programs maps a program name to its entry point, which gets the
// program's arguments and returns the exit code.
var programs = map[string]func(args []string) int{
	"etcd": runEtcd,
	"kube-apiserver": func(args []string) int {
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kube-controller-manager": func(args []string) int {
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kube-scheduler": func(args []string) int {
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kubelet": func(args []string) int {
		cmd := kubelet.NewKubeletCommand(context.Background())
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kubectl": runKubectl,
}

func runKubectl(args []string) int {
	// kubectl reads the verbosity from os.Args before its flags are parsed.
	os.Args = append([]string{"kubectl"}, args...)
	_, _ = logs.GlogSetter(kubectl.GetLogVerbosity(os.Args))
	cmd := kubectl.NewDefaultKubectlCommand()
	cmd.SetArgs(args)
	if err := cli.RunNoErrOutput(cmd); err != nil {
		kubectlutil.CheckErr(err)
		return 1
	}
	return 0
}

func names() string {
	list := make([]string, 0, len(programs))
	for name := range programs {
		list = append(list, name)
	}
	sort.Strings(list)
	return strings.Join(list, ", ")
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if _, ok := programs[name]; !ok {
		if len(args) == 0 {
			fmt.Fprintf(os.Stderr, "usage: %s PROGRAM ARGS...\nprograms: %s\n", name, names())
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	run, ok := programs[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "tessera-kube: unknown program %q (programs: %s)\n", name, names())
		os.Exit(2)
	}
	os.Exit(run(args))
}
