// Command probe is the workload of the cluster's own test image: it prints
// what a container sees of itself (host name, ids, cgroup, the
// environment variables named as arguments) and exits 0, or sleeps first
// with --sleep.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	sleep := flag.Duration("sleep", 0, "how long to sleep before exiting")
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
	if *sleep > 0 {
		time.Sleep(*sleep)
	}
	fmt.Println("probe: done")
}
