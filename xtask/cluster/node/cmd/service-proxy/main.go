// Command service-proxy carries the kubernetes service's traffic to the
// API server: it listens on the service's cluster IP and port and copies
// each connection to the API server's address, byte for byte (TLS passes
// through untouched; the API server's certificate names the cluster IP).
// The cluster runs no kube-proxy, and pods reach the API server only
// through this service (KUBERNETES_SERVICE_HOST), so this is its data path.
//
//	service-proxy --listen 10.96.0.1:443 --to 10.88.0.1:6443
//
// The cluster IP must be an address of this host (`cluster up` puts it on
// the pod network's bridge, which pods route through).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"
)

func main() {
	listen := flag.String("listen", "", "address to accept on (the service's cluster IP:port)")
	to := flag.String("to", "", "address to connect to (the API server's IP:port)")
	flag.Parse()
	if *listen == "" || *to == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: service-proxy --listen IP:PORT --to IP:PORT")
		os.Exit(2)
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("service-proxy: cannot listen on %s: %v", *listen, err)
	}
	log.Printf("service-proxy: %s -> %s", *listen, *to)
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Printf("service-proxy: accept: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go relay(c, *to)
	}
}

// relay copies c to and from a new connection to `to`, closing each
// direction's writer when its reader ends.
func relay(c net.Conn, to string) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", to, 5*time.Second)
	if err != nil {
		log.Printf("service-proxy: cannot connect to %s for %s: %v", to, c.RemoteAddr(), err)
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if t, ok := dst.(*net.TCPConn); ok {
			_ = t.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	<-done
}
