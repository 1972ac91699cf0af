// YCSB binding for FlatKV over the Java Thrift client (framed transport,
// binary protocol). YCSB makes one DB object per client thread, so each
// thread has its own connection, opened in init() and reused for every
// operation.
//
// Properties (-p name=value):
//   flatkv.host        server address                    (127.0.0.1)
//   flatkv.port        Thrift port                       (9901)
//   flatkv.keys        int | string                      (int)
//   flatkv.timeout_ms  connect and per-call timeout, ms  (10000)
//   flatkv.ring        false | true                      (false)
//
// Rings. By default every call goes to flatkv.host, which serves any key
// (forwarding those of other marks). With flatkv.ring=true the binding reads
// the ring once from flatkv.host's ring() and sends each call straight to the
// owner of its key's hash (writes to the head of the mark's chain, reads to
// its tail; a string key hashes to XXH64(key, seed 0) mod hashBound), one
// connection per member per thread; after NOT_OWNER or UNAVAILABLE it reads
// the ring again and retries once. Scans go to flatkv.host (ring-wide).
//
// Keys. With flatkv.keys=int, YCSB's key "user<N>" is the integer key N
// (so run YCSB with insertorder=ordered, as client/ycsb/run.sh does: hashed
// insert order spreads N over 2^63 and makes every record a segment of its
// own); scans are FlatKV's key-order scan. With flatkv.keys=string, the key
// is the string itself (sget/sput/sremove); string keys are hashed, so scan
// is NOT_IMPLEMENTED. The table name is ignored: FlatKV has one key space.
//
// Records. A YCSB record (field name -> bytes) is one FlatKV value:
// for each field, a 4-byte big-endian name length, the name in UTF-8, a
// 4-byte value length and the value.
//
// Update. FlatKV has no partial write, so an update that sets some of the
// record's fields reads the record and writes it back merged (get + put,
// two round trips, not atomic against a concurrent update of the same key).
// An update that sets every field (fieldcount of them, as with
// writeallfields=true) is a plain put.
package site.ycsb.db.flatkv;

import flatkv.rpc.ErrorCode;
import flatkv.rpc.FlatKV;
import flatkv.rpc.GetResult;
import flatkv.rpc.KvError;
import flatkv.rpc.KvPair;
import flatkv.rpc.Member;
import flatkv.rpc.Partition;
import flatkv.rpc.RingInfo;
import flatkv.rpc.ScanResult;
import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import net.jpountz.xxhash.XXHash64;
import net.jpountz.xxhash.XXHashFactory;
import org.apache.thrift.TConfiguration;
import org.apache.thrift.TException;
import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.transport.TSocket;
import org.apache.thrift.transport.TTransport;
import org.apache.thrift.transport.layered.TFramedTransport;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

public class FlatKVClient extends DB {
  private String host;
  private int port;
  private int timeoutMs;
  private boolean stringKeys;
  private int fieldCount;
  private TTransport transport;
  private FlatKV.Client kv;
  // flatkv.ring=true: mark -> chain ("host:port", head first), the hash
  // bound, and a connection per member.
  private boolean ringAware;
  private TreeMap<Long, List<String>> chains;
  private long hashBound;
  private final Map<String, TTransport> memberTransports = new HashMap<>();
  private final Map<String, FlatKV.Client> members = new HashMap<>();
  private static final XXHash64 XXH64 = XXHashFactory.fastestJavaInstance().hash64();

  // One call of an operation, on the connection it is routed to.
  private interface Call<T> {
    T run(FlatKV.Client c) throws TException;
  }

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    host = p.getProperty("flatkv.host", "127.0.0.1");
    port = Integer.parseInt(p.getProperty("flatkv.port", "9901"));
    timeoutMs = Integer.parseInt(p.getProperty("flatkv.timeout_ms", "10000"));
    String keys = p.getProperty("flatkv.keys", "int");
    if (!keys.equals("int") && !keys.equals("string")) {
      throw new DBException("flatkv.keys must be int or string, not " + keys);
    }
    stringKeys = keys.equals("string");
    ringAware = Boolean.parseBoolean(p.getProperty("flatkv.ring", "false"));
    fieldCount = Integer.parseInt(p.getProperty("fieldcount", "10"));
    try {
      connect();
      if (ringAware) loadRing();
    } catch (TException e) {
      throw new DBException("cannot connect to FlatKV at " + host + ":" + port + ": " + e, e);
    }
  }

  @Override
  public void cleanup() {
    if (transport != null) transport.close();
    for (TTransport t : memberTransports.values()) t.close();
  }

  private void loadRing() throws TException {
    ensureOpen();
    RingInfo ring = kv.ring();
    TreeMap<Long, List<String>> m = new TreeMap<>();
    for (Partition p : ring.getPartitions()) {
      List<String> chain = new java.util.ArrayList<>();
      for (Member member : p.getChain()) chain.add(member.getHost() + ":" + member.getPort());
      m.put(p.getMark(), chain);
    }
    chains = m;
    hashBound = ring.getHashBound();
  }

  // The ring's owner of hash h: the smallest mark above h, else the lowest.
  private List<String> owner(long h) {
    Map.Entry<Long, List<String>> e = chains.higherEntry(h);
    return (e != null ? e : chains.firstEntry()).getValue();
  }

  private long hashOf(String key) {
    if (!stringKeys) return intKey(key);
    byte[] b = key.getBytes(StandardCharsets.UTF_8);
    return Long.remainderUnsigned(XXH64.hash(b, 0, b.length, 0), hashBound);
  }

  private FlatKV.Client member(String address) throws TException {
    FlatKV.Client c = members.get(address);
    if (c != null) return c;
    int colon = address.lastIndexOf(':');
    TTransport t = new TFramedTransport(new TSocket(new TConfiguration(),
        address.substring(0, colon), Integer.parseInt(address.substring(colon + 1)),
        timeoutMs, timeoutMs));
    t.open();
    c = new FlatKV.Client(new TBinaryProtocol(t));
    memberTransports.put(address, t);
    members.put(address, c);
    return c;
  }

  // Runs "call" for "key": on flatkv.host, or (ring-aware) on the head
  // (write) or tail (read) of the key's owner, once more after re-reading
  // the ring if that member says NOT_OWNER or UNAVAILABLE.
  private <T> T routed(String key, boolean write, Call<T> call) throws TException {
    ensureOpen();
    if (!ringAware) return call.run(kv);
    for (int attempt = 0; ; ++attempt) {
      List<String> chain = owner(hashOf(key));
      String address = chain.isEmpty() ? null : chain.get(write ? 0 : chain.size() - 1);
      try {
        if (address == null) throw new KvError(ErrorCode.UNAVAILABLE, "no member serves the key");
        return call.run(member(address));
      } catch (KvError e) {
        boolean stale = e.getCode() == ErrorCode.NOT_OWNER || e.getCode() == ErrorCode.UNAVAILABLE;
        if (!stale || attempt > 0) throw e;
      } catch (TException e) {
        TTransport t = memberTransports.remove(address);
        members.remove(address);
        if (t != null) t.close();
        if (attempt > 0) throw e;
      }
      loadRing();
    }
  }

  private void connect() throws TException {
    transport = new TFramedTransport(
        new TSocket(new TConfiguration(), host, port, timeoutMs, timeoutMs));
    transport.open();
    kv = new FlatKV.Client(new TBinaryProtocol(transport));
  }

  // After a transport error the connection's state is unknown: the next
  // operation opens a new one.
  private Status failed(Exception e) {
    if (!(e instanceof KvError) && transport != null) {
      transport.close();
      transport = null;
    }
    System.err.println("flatkv: " + e);
    return Status.ERROR;
  }

  private void ensureOpen() throws TException {
    if (transport == null) connect();
  }

  // "user123" -> 123: the digits after the key's prefix.
  static long intKey(String key) {
    int i = 0;
    while (i < key.length() && !Character.isDigit(key.charAt(i))) i++;
    if (i == key.length()) throw new IllegalArgumentException("no number in key " + key);
    return Long.parseLong(key.substring(i));
  }

  private static ByteBuffer utf8(String s) {
    return ByteBuffer.wrap(s.getBytes(StandardCharsets.UTF_8));
  }

  private GetResult getRecord(String key) throws TException {
    return routed(key, false, c -> stringKeys ? c.sget(utf8(key)) : c.get(intKey(key)));
  }

  private void putRecord(String key, Map<String, ByteIterator> values) throws TException {
    ByteBuffer value = encode(values);
    routed(key, true, c -> {
      if (stringKeys) {
        c.sput(utf8(key), value.duplicate());
      } else {
        c.put(intKey(key), value.duplicate());
      }
      return null;
    });
  }

  static ByteBuffer encode(Map<String, ByteIterator> values) {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    DataOutputStream out = new DataOutputStream(bytes);
    try {
      for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
        byte[] name = e.getKey().getBytes(StandardCharsets.UTF_8);
        byte[] value = e.getValue().toArray();
        out.writeInt(name.length);
        out.write(name);
        out.writeInt(value.length);
        out.write(value);
      }
    } catch (IOException e) {
      throw new IllegalStateException(e);  // a ByteArrayOutputStream does not fail
    }
    return ByteBuffer.wrap(bytes.toByteArray());
  }

  // Decodes a record into "result", keeping only "fields" (all if null).
  static void decode(byte[] record, Set<String> fields, Map<String, ByteIterator> result) {
    ByteBuffer in = ByteBuffer.wrap(record);
    while (in.remaining() >= 8) {
      byte[] name = new byte[in.getInt()];
      in.get(name);
      byte[] value = new byte[in.getInt()];
      in.get(value);
      String field = new String(name, StandardCharsets.UTF_8);
      if (fields == null || fields.contains(field)) {
        result.put(field, new ByteArrayByteIterator(value));
      }
    }
  }

  @Override
  public Status read(String table, String key, Set<String> fields,
                     Map<String, ByteIterator> result) {
    try {
      ensureOpen();
      GetResult r = getRecord(key);
      if (!r.isFound()) return Status.NOT_FOUND;
      decode(r.getValue(), fields, result);
      return Status.OK;
    } catch (TException | RuntimeException e) {
      return failed(e);
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
                     Vector<HashMap<String, ByteIterator>> result) {
    if (stringKeys) return Status.NOT_IMPLEMENTED;  // string keys are hashed: no key order
    try {
      ensureOpen();
      long from = intKey(startkey);
      // One call may answer fewer pairs than asked (its work is bounded);
      // continue from nextKey until done or enough.
      while (result.size() < recordcount) {
        ScanResult s = kv.scan(from, recordcount - result.size(), false);
        for (KvPair pair : s.getPairs()) {
          HashMap<String, ByteIterator> record = new HashMap<>();
          decode(pair.getValue(), fields, record);
          result.add(record);
        }
        if (s.isDone()) break;
        from = s.getNextKey();
      }
      return Status.OK;
    } catch (TException | RuntimeException e) {
      return failed(e);
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      ensureOpen();
      if (values.size() >= fieldCount) {  // every field: nothing to keep
        putRecord(key, values);
        return Status.OK;
      }
      GetResult r = getRecord(key);
      if (!r.isFound()) return Status.NOT_FOUND;
      Map<String, ByteIterator> record = new HashMap<>();
      decode(r.getValue(), null, record);
      record.putAll(values);
      putRecord(key, record);
      return Status.OK;
    } catch (TException | RuntimeException e) {
      return failed(e);
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    try {
      ensureOpen();
      putRecord(key, values);
      return Status.OK;
    } catch (TException | RuntimeException e) {
      return failed(e);
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      ensureOpen();
      boolean existed = routed(key, true,
          c -> stringKeys ? c.sremove(utf8(key)) : c.remove(intKey(key)));
      return existed ? Status.OK : Status.NOT_FOUND;
    } catch (TException | RuntimeException e) {
      return failed(e);
    }
  }
}
