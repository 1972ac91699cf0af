// A small YCSB binding for Redis, for measuring FlatKV against Redis in the
// same run (YCSB's own redis-binding is not on Maven Central). It does what
// YCSB's redis-binding 0.17 does, so figures compare with published ones:
// a record is a hash (HMSET / HGETALL / HMGET), an update is one HMSET of
// the fields it sets, and a sorted set "_indices" scored by the key's
// String.hashCode() serves scans (so an insert is HMSET + ZADD and a delete
// DEL + ZREM: two round trips each). One connection per YCSB thread.
//
// Properties: redis.host (127.0.0.1), redis.port (6379), redis.timeout_ms (10000).
package site.ycsb.db.redis;

import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.exceptions.JedisException;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

public class RedisClient extends DB {
  private static final String INDEX_KEY = "_indices";
  private Jedis jedis;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String host = p.getProperty("redis.host", "127.0.0.1");
    int port = Integer.parseInt(p.getProperty("redis.port", "6379"));
    int timeoutMs = Integer.parseInt(p.getProperty("redis.timeout_ms", "10000"));
    try {
      jedis = new Jedis(host, port, timeoutMs);
      jedis.connect();
    } catch (JedisException e) {
      throw new DBException("cannot connect to Redis at " + host + ":" + port + ": " + e, e);
    }
  }

  @Override
  public void cleanup() {
    if (jedis != null) jedis.close();
  }

  private static double hash(String key) {
    return key.hashCode();
  }

  @Override
  public Status read(String table, String key, Set<String> fields,
                     Map<String, ByteIterator> result) {
    try {
      if (fields == null) {
        Map<String, String> all = jedis.hgetAll(key);
        if (all.isEmpty()) return Status.NOT_FOUND;
        StringByteIterator.putAllAsByteIterators(result, all);
      } else {
        String[] names = fields.toArray(new String[0]);
        List<String> values = jedis.hmget(key, names);
        Iterator<String> v = values.iterator();
        boolean any = false;
        for (String name : names) {
          String value = v.next();
          if (value != null) {
            result.put(name, new StringByteIterator(value));
            any = true;
          }
        }
        if (!any) return Status.NOT_FOUND;
      }
      return Status.OK;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    try {
      jedis.hmset(key, StringByteIterator.getStringMap(values));
      jedis.zadd(INDEX_KEY, hash(key), key);
      return Status.OK;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      long removed = jedis.del(key) + jedis.zrem(INDEX_KEY, key);
      return removed > 0 ? Status.OK : Status.NOT_FOUND;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      jedis.hmset(key, StringByteIterator.getStringMap(values));
      return Status.OK;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
                     Vector<HashMap<String, ByteIterator>> result) {
    try {
      for (String key : jedis.zrangeByScore(INDEX_KEY, hash(startkey),
                                            Double.POSITIVE_INFINITY, 0, recordcount)) {
        HashMap<String, ByteIterator> record = new HashMap<>();
        read(table, key, fields, record);
        result.add(record);
      }
      return Status.OK;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }
}
