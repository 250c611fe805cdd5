// Command probe is the workload of the cluster's own test image: it prints
// what a container sees of itself (host name, ids, cgroup, the
// environment variables named as arguments) and exits 0, or sleeps first
// with --sleep. Each --write PATH opens PATH for writing and says what the
// kernel answered (a limit's file must be read-only in a container).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

type paths []string

func (p *paths) String() string     { return strings.Join(*p, ",") }
func (p *paths) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	sleep := flag.Duration("sleep", 0, "how long to sleep before exiting")
	var writes paths
	flag.Var(&writes, "write", "a file to try to open for writing (repeatable)")
	flag.Parse()
	host, err := os.Hostname()
	if err != nil {
		host = "?"
	}
	fmt.Printf("probe: hostname=%s pid=%d uid=%d gid=%d\n", host, os.Getpid(), os.Getuid(), os.Getgid())
	if cgroup, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(cgroup)), "\n") {
			fmt.Printf("probe: cgroup %s\n", line)
		}
	}
	for _, name := range flag.Args() {
		fmt.Printf("probe: env %s=%s\n", name, os.Getenv(name))
	}
	for _, path := range writes {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			fmt.Printf("probe: write %s: %v\n", path, err)
			continue
		}
		f.Close()
		fmt.Printf("probe: write %s: ok\n", path)
	}
	if *sleep > 0 {
		time.Sleep(*sleep)
	}
	fmt.Println("probe: done")
}
