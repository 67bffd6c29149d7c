package web_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// rawCodec carries messages as bytes: a gRPC service without generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

// chat answers every message of a bidirectional stream as soon as it arrives: a reply that
// came only once the client closed its side would show a proxy that buffers.
var chat = grpc.StreamDesc{StreamName: "Chat", ServerStreams: true, ClientStreams: true,
	Handler: func(_ any, stream grpc.ServerStream) error {
		for {
			var msg []byte
			if err := stream.RecvMsg(&msg); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
			reply := []byte("re: " + string(msg))
			if err := stream.SendMsg(&reply); err != nil {
				return err
			}
		}
	}}

// A gRPC server reached over h2c (the Service port's appProtocol kubernetes.io/h2c) answers
// a client's bidirectional stream through the proxy, message by message.
func TestGRPCStreamingToAnH2CBackend(t *testing.T) {
	backend := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	backend.RegisterService(&grpc.ServiceDesc{ServiceName: "echo.Echo", HandlerType: (*any)(nil), Streams: []grpc.StreamDesc{chat}}, struct{}{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(backend.Stop)

	ca := proxytest.NewCA(t)
	cert, err := ca.Certificate(t.Context(), "grpc.tail.test")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		backend contract.Backend
		works   bool
	}{
		{"h2c", contract.Backend{URL: "http://" + ln.Addr().String(), Protocol: contract.BackendH2C}, true},
		// Balanced across the endpoints, the ClusterIP (here a port nothing listens on) unused.
		{"h2c to endpoints", contract.Backend{URL: "http://127.0.0.1:1", Endpoints: []string{ln.Addr().String()}, Protocol: contract.BackendH2C}, true},
		{"HTTP/1.1", contract.Backend{URL: "http://" + ln.Addr().String()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lb := startLoopback(t, contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: tc.backend}}}, nil)
			lb.srv.SetName("grpc.tail.test")
			lb.srv.SetCertificate(cert)
			conn, err := grpc.NewClient("passthrough:///"+lb.https,
				grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "grpc.tail.test"})),
				grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			stream, err := conn.NewStream(ctx, &chat, "/echo.Echo/Chat")
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				msg := []byte(fmt.Sprint("hello ", i))
				err := stream.SendMsg(&msg)
				var reply []byte
				if err == nil {
					err = stream.RecvMsg(&reply)
				}
				if !tc.works {
					if err == nil {
						t.Fatalf("an HTTP/1.1 request to an h2c-only server answered %q", reply)
					}
					return
				}
				if err != nil || string(reply) != "re: "+string(msg) {
					t.Fatalf("message %d: reply %q, %v", i, reply, err)
				}
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			var extra []byte
			if err := stream.RecvMsg(&extra); !errors.Is(err, io.EOF) {
				t.Errorf("after the client closed: %q, %v; want the stream's end", extra, err)
			}
		})
	}
}
