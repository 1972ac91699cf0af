// The FlatKV client in Java: the shortest correct program to copy. One
// framed, binary-protocol connection with timeouts, reused for every call.
//
//   mvn package && java -jar target/flatkv-example.jar 127.0.0.1 9901
package flatkv.example;

import flatkv.rpc.FlatKV;
import flatkv.rpc.GetResult;
import flatkv.rpc.KvError;
import flatkv.rpc.KvPair;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.List;
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
    // timeout) or a KvError not caught below ends the program.
    try (TTransport transport = new TFramedTransport(new TSocket(new TConfiguration(), host, port, 5000, 2000))) {
      transport.open();
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

  static ByteBuffer bytes(String s) {
    return ByteBuffer.wrap(s.getBytes(StandardCharsets.UTF_8));
  }

  static String string(GetResult r) {
    return new String(r.getValue(), StandardCharsets.UTF_8);
  }
}
