package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd runs a one-member etcd, embedded, until SIGTERM or SIGINT.
func runEtcd(args []string) int {
	flags := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := flags.String("data-dir", "etcd-data", "folder of the member's data")
	clientURL := flags.String("client-url", "http://127.0.0.1:2379", "URL clients connect to")
	peerURL := flags.String("peer-url", "http://127.0.0.1:2380", "URL of the member's peer listener")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if flags.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "etcd: unexpected arguments %q\n", flags.Args())
		return 2
	}
	client, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --client-url %q: %v\n", *clientURL, err)
		return 2
	}
	peer, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --peer-url %q: %v\n", *peerURL, err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = "tessera"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: cannot start: %v\n", err)
		return 1
	}
	defer server.Close()
	select {
	case <-server.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", client)
	case <-time.After(60 * time.Second):
		server.Server.Stop()
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60 s")
		return 1
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case sig := <-stop:
		fmt.Fprintf(os.Stderr, "etcd: stopping on %v\n", sig)
		return 0
	case err := <-server.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
