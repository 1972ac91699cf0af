// A real FlatKV server inside a fuzz target's process: a Store over a
// temporary directory, the write-back cache, the Handler, the
// FrontProcessor, and (on demand) the EventServer on a loopback port and
// the HTTP server, configured as flatkv-server configures them. Built once
// per process (LLVMFuzzerTestOneInput calls Get()); the store persists
// across inputs, as a real server's does across clients.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "engine/cache/write_back.h"
#include "engine/store.h"
#include "server/config.h"
#include "server/event_server.h"
#include "server/front_processor.h"
#include "server/handler.h"
#include "server/http.h"
#include "tests/fuzz/fuzz_util.h"

namespace flatkv::fuzz {

struct ServerFixture {
  server::Config config;
  std::unique_ptr<engine::Store> store;
  std::unique_ptr<engine::cache::WriteBackCache> cache;
  std::shared_ptr<server::Handler> handler;
  std::shared_ptr<server::FrontProcessor> processor;
  std::unique_ptr<server::EventServer> thrift;
  std::unique_ptr<server::HttpServer> http;

  // "with_thrift"/"with_http": also serve on loopback ports.
  static ServerFixture& Get(bool with_thrift, bool with_http) {
    static ServerFixture* f = [&] {
      Quiet();
      auto* s = new ServerFixture;
      std::vector<std::string> sets = {
          "server.port=0", "server.io_threads=1", "server.workers=0",
          "server.max_frame_bytes=1Mi", "storage.path=" + FreshDir("server-store"),
          "storage.max_value_bytes=64Ki", "cache.capacity_bytes=1Mi", "admin.token=fuzz",
          "log.level=off"};
      if (!server::LoadConfig("", sets, &s->config).ok()) std::abort();
      s->config.server.http_port = 0;
      if (!engine::Store::Open(s->config.storage, &s->store).ok()) std::abort();
      if (!engine::cache::WriteBackCache::Open(s->store.get(), s->config.cache, &s->cache).ok()) {
        std::abort();
      }
      s->handler = std::make_shared<server::Handler>(s->store.get(), s->cache.get(), s->config);
      s->handler->TEST_DisableBackup();  // no directories written where an input says
      s->processor = std::make_shared<server::FrontProcessor>(s->handler, nullptr, 256);
      if (with_thrift) {
        s->thrift = std::make_unique<server::EventServer>(s->processor, s->config);
        if (!s->thrift->Start().ok()) std::abort();
      }
      if (with_http) {
        s->http = std::make_unique<server::HttpServer>(s->handler.get(), s->config);
        if (!s->http->Start().ok()) std::abort();
      }
      // At exit, stop the threads (flushers, compactor, checkpointer, the
      // ports) before the static objects they use go: the process
      // directory (TempRoot) is deleted and spdlog's loggers are freed by
      // static destructors, which run after this handler (registered
      // later than they were built). A compactor or checkpoint failing on
      // the deleted files and logging to a freed logger was a
      // heap-use-after-free at the end of a 300 s chain_fuzz run.
      std::atexit([] {
        ServerFixture* x = f;
        if (x == nullptr) return;
        if (x->http) x->http->Stop();
        if (x->thrift) x->thrift->Stop();
        (void)x->cache->Close();
        (void)x->store->Close();
      });
      return s;
    }();
    return *f;
  }
};

}  // namespace flatkv::fuzz
