// The FlatKV client in Go: the shortest correct program to copy. One framed,
// binary-protocol connection with timeouts, reused for every call.
//
//	thrift --gen go -out gen-go flatkv.thrift && go run . 127.0.0.1 9901
//
// A third argument, a CA file (PEM), connects over TLS to a server with
// server.tls_cert_file: its certificate must chain to that CA and name the
// host.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/apache/thrift/lib/go/thrift"

	"flatkv.example/gen-go/flatkv"
)

func main() {
	host, port := "127.0.0.1", "9901"
	if len(os.Args) > 2 {
		host, port = os.Args[1], os.Args[2]
	}
	conf := &thrift.TConfiguration{ConnectTimeout: 2 * time.Second, SocketTimeout: 5 * time.Second}
	var socket thrift.TTransport
	if len(os.Args) > 3 {
		// TLS: the server's certificate must chain to a CA of this file and
		// name the host (crypto/tls verifies both by default).
		pem, err := os.ReadFile(os.Args[3])
		must(err)
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			must(fmt.Errorf("no PEM certificate in %s", os.Args[3]))
		}
		conf.TLSConfig = &tls.Config{RootCAs: pool}
		socket = thrift.NewTSSLSocketConf(host+":"+port, conf)
	} else {
		socket = thrift.NewTSocketConf(host+":"+port, conf)
	}
	transport := thrift.NewTFramedTransportConf(socket, conf)
	if err := transport.Open(); err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	defer transport.Close()
	protocol := thrift.NewTBinaryProtocolConf(transport, conf)
	kv := flatkv.NewFlatKVClient(thrift.NewTStandardClient(protocol, protocol))
	ctx := context.Background()

	// Integer keys.
	must(kv.Put(ctx, 1, []byte("hello")))
	r, err := kv.Get(ctx, 1)
	must(err)
	fmt.Printf("get 1 = %s\n", r.Value)
	r, err = kv.Get(ctx, 2)
	must(err)
	fmt.Printf("get 2 found = %v\n", r.Found) // not found is not an error

	// String keys.
	must(kv.Sput(ctx, []byte("user:42"), []byte(`{"name":"ada"}`)))
	r, err = kv.Sget(ctx, []byte("user:42"))
	must(err)
	fmt.Printf("sget user:42 = %s\n", r.Value)

	// A batch: one round trip; results come in request order.
	must(kv.MultiPut(ctx, []*flatkv.KvPair{
		{Key: 10, Value: []byte("v10")}, {Key: 11, Value: []byte("v11")}, {Key: 12, Value: []byte("v12")},
	}))
	rs, err := kv.MultiGet(ctx, []int64{10, 11, 12})
	must(err)
	fmt.Print("multiGet 10 11 12 =")
	for _, r := range rs {
		fmt.Printf(" %s", r.Value)
	}
	fmt.Println()

	// Every failure the server reports is a typed *flatkv.KvError.
	err = kv.Put(ctx, -5, []byte("x"))
	var kvErr *flatkv.KvError
	if errors.As(err, &kvErr) {
		fmt.Printf("put -5: KvError %s: %s\n", kvErr.Code, kvErr.Message)
	} else {
		fmt.Fprintln(os.Stderr, "put -5: expected a KvError, got", err)
		os.Exit(1)
	}
}

// must stops on a transport error (connection refused, timeout) or a KvError.
func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "flatkv:", err)
		os.Exit(1)
	}
}
