// The FlatKV client in Java: the shortest correct program to copy. One
// framed, binary-protocol connection with timeouts, reused for every call.
//
//   mvn package && java -jar target/flatkv-example.jar 127.0.0.1 9901
//
// A third argument, a CA file (PEM), connects over TLS to a server with
// server.tls_cert_file: its certificate must chain to that CA and name the
// host.
package flatkv.example;

import flatkv.rpc.FlatKV;
import flatkv.rpc.GetResult;
import flatkv.rpc.KvError;
import flatkv.rpc.KvPair;
import java.io.FileInputStream;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.List;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;
import org.apache.thrift.TConfiguration;
import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.transport.TSocket;
import org.apache.thrift.transport.TTransport;
import org.apache.thrift.transport.layered.TFramedTransport;

public final class Example {
  public static void main(String[] args) throws Exception {
    String host = args.length > 1 ? args[0] : "127.0.0.1";
    int port = args.length > 1 ? Integer.parseInt(args[1]) : 9901;
    // 5 s per call, 2 s to connect. A TException (connection refused,
    // timeout), an IOException (TLS handshake) or a KvError not caught
    // below ends the program.
    TSocket socket = args.length > 2
        ? new TSocket(tlsSocket(host, port, args[2]))
        : new TSocket(new TConfiguration(), host, port, 5000, 2000);
    try (TTransport transport = new TFramedTransport(socket)) {
      if (!transport.isOpen()) transport.open(); // a TLS socket is connected already
      FlatKV.Client kv = new FlatKV.Client(new TBinaryProtocol(transport));

      // Integer keys.
      kv.put(1, bytes("hello"));
      System.out.println("get 1 = " + string(kv.get(1)));
      System.out.println("get 2 found = " + kv.get(2).isFound()); // not found is not an error

      // String keys.
      kv.sput(bytes("user:42"), bytes("{\"name\":\"ada\"}"));
      System.out.println("sget user:42 = " + string(kv.sget(bytes("user:42"))));

      // A batch: one round trip; results come in request order.
      kv.multiPut(List.of(new KvPair(10, bytes("v10")), new KvPair(11, bytes("v11")),
                          new KvPair(12, bytes("v12"))));
      StringBuilder line = new StringBuilder("multiGet 10 11 12 =");
      for (GetResult r : kv.multiGet(List.of(10L, 11L, 12L))) line.append(' ').append(string(r));
      System.out.println(line);

      // Every failure the server reports is a typed KvError.
      try {
        kv.put(-5, bytes("x"));
      } catch (KvError e) {
        System.out.println("put -5: KvError " + e.getCode() + ": " + e.getMessage());
      }
    }
  }

  // A TLS connection that trusts the CAs of caFile (PEM) only and checks
  // that the server's certificate names host (a DNS or IP subject
  // alternative name), the way HTTPS does.
  static Socket tlsSocket(String host, int port, String caFile) throws Exception {
    KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
    trust.load(null, null);
    try (InputStream in = new FileInputStream(caFile)) {
      int i = 0;
      for (Certificate ca : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
        trust.setCertificateEntry("ca" + i++, ca);
      }
    }
    TrustManagerFactory tmf =
        TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
    tmf.init(trust);
    SSLContext context = SSLContext.getInstance("TLS");
    context.init(null, tmf.getTrustManagers(), null);

    Socket plain = new Socket();
    plain.connect(new InetSocketAddress(host, port), 2000);
    SSLSocket tls = (SSLSocket) context.getSocketFactory().createSocket(plain, host, port, true);
    SSLParameters params = tls.getSSLParameters();
    params.setEndpointIdentificationAlgorithm("HTTPS");
    tls.setSSLParameters(params);
    tls.setSoTimeout(5000);
    tls.startHandshake(); // fails here if the server is not verified
    return tls;
  }

  static ByteBuffer bytes(String s) {
    return ByteBuffer.wrap(s.getBytes(StandardCharsets.UTF_8));
  }

  static String string(GetResult r) {
    return new String(r.getValue(), StandardCharsets.UTF_8);
  }
}
