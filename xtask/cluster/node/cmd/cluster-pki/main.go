// Command cluster-pki writes the keys and certificates of the cluster of
// `cargo xtask cluster`: a CA, the API server's serving certificate, a
// client certificate per component and for the administrator, the
// kubelet's serving certificate and the service-account signing key.
// Files already there are kept, so a second run changes nothing.
//
//	cluster-pki --dir target/cluster/run/pki --node tessera-node --node-ip 10.88.0.1
package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// cert is one certificate the cluster needs, signed by the CA.
type cert struct {
	name   string // file stem: NAME.crt and NAME.key
	cn     string
	orgs   []string
	server bool // serving (else client) certificate
	dns    []string
	ips    []net.IP
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "cluster-pki: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	flags := flag.NewFlagSet("cluster-pki", flag.ContinueOnError)
	dir := flags.String("dir", "", "folder of the keys and certificates")
	node := flags.String("node", "", "the node's name")
	serviceIP := flags.String("service-ip", "10.96.0.1", "the kubernetes service's cluster IP")
	nodeIPFlag := flags.String("node-ip", "", "the node's address, where the API server and the kubelet serve")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *node == "" || *nodeIPFlag == "" || flags.NArg() > 0 {
		return errors.New("usage: cluster-pki --dir DIR --node NAME --node-ip IP [--service-ip IP]")
	}
	nodeIP := net.ParseIP(*nodeIPFlag)
	if nodeIP == nil {
		return fmt.Errorf("bad --node-ip %q", *nodeIPFlag)
	}
	svc := net.ParseIP(*serviceIP)
	if svc == nil {
		return fmt.Errorf("bad --service-ip %q", *serviceIP)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	caCert, caKey, err := loadOrMakeCA(*dir)
	if err != nil {
		return err
	}
	loopback := net.ParseIP("127.0.0.1")
	certs := []cert{
		{name: "apiserver", cn: "kube-apiserver", server: true,
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			ips: []net.IP{loopback, nodeIP, svc}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{name: "admin", cn: "tessera-admin", orgs: []string{"system:masters"}},
		{name: "kube-controller-manager", cn: "system:kube-controller-manager"},
		{name: "kube-scheduler", cn: "system:kube-scheduler"},
		{name: "kubelet", cn: "system:node:" + *node, orgs: []string{"system:nodes"}},
		{name: "kubelet-serving", cn: *node, server: true, dns: []string{*node, "localhost"}, ips: []net.IP{loopback, nodeIP}},
	}
	for _, c := range certs {
		if err := makeCert(*dir, c, caCert, caKey); err != nil {
			return fmt.Errorf("certificate %s: %w", c.name, err)
		}
	}
	return makeServiceAccountKey(*dir)
}

func exists(paths ...string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

func writeCert(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func loadOrMakeCA(dir string) (*x509.Certificate, crypto.Signer, error) {
	crtPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if exists(crtPath, keyPath) {
		return loadCA(crtPath, keyPath)
	}
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "tessera-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := writeCert(crtPath, der); err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func loadCA(crtPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	crtPEM, err := os.ReadFile(crtPath)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	crtBlock, _ := pem.Decode(crtPEM)
	keyBlock, _ := pem.Decode(keyPEM)
	if crtBlock == nil || keyBlock == nil {
		return nil, nil, fmt.Errorf("%s or %s is not PEM", crtPath, keyPath)
	}
	ca, err := x509.ParseCertificate(crtBlock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s holds no signing key", keyPath)
	}
	return ca, signer, nil
}

func makeCert(dir string, c cert, ca *x509.Certificate, caKey crypto.Signer) error {
	crtPath, keyPath := filepath.Join(dir, c.name+".crt"), filepath.Join(dir, c.name+".key")
	if exists(crtPath, keyPath) {
		return nil
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	sn, err := serial()
	if err != nil {
		return err
	}
	usage := x509.ExtKeyUsageClientAuth
	if c.server {
		usage = x509.ExtKeyUsageServerAuth
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: c.cn, Organization: c.orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     c.dns,
		IPAddresses:  c.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	return writeCert(crtPath, der)
}

func makeServiceAccountKey(dir string) error {
	keyPath, pubPath := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if exists(keyPath, pubPath) {
		return nil
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	return os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}
