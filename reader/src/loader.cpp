// The consumer's side of the loader: Create (options resolved, the ring laid out, workers
// started) and Next (waiting for the next batch in order and handing out its lease). The other
// parts are listed in loader_internal.h.
#include "shardfeed/reader/loader.h"

#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "failpoint.h"
#include "loader_internal.h"
#include "pixel_store.h"
#include "shardfeed/base/cpus.h"
#include "shardfeed/format/stats_record.h"
#include "shardfeed/reader/options.h"

namespace shardfeed::reader {

size_t Batch::image_bytes() const {
  size_t n = DTypeSize(dtype_);
  for (int64_t d : shape_) n *= static_cast<size_t>(d);
  return n;
}

const std::vector<BatchField>& Batch::fields() const {
  static const std::vector<BatchField> kNone;
  return fields_ ? *fields_ : kNone;
}

const BatchField* Batch::field(std::string_view name) const {
  for (const BatchField& f : fields()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const void* Batch::device_images() const { return device_ ? device_->device_images() : nullptr; }

const int64_t* Batch::device_labels() const {
  return device_ ? reinterpret_cast<const int64_t*>(
                       static_cast<const uint8_t*>(device_->device_data()) + device_label_offset_)
                 : nullptr;
}

Status Batch::Wait(void* stream) const {
  if (!device_) return Status::InvalidArgument("batch is not on a device");
  return device_->StreamWait(stream);
}

Status Batch::Synchronize() const {
  if (!device_) return Status::OK();
  return device_->Synchronize();
}

// ---- The tuner's inputs --------------------------------------------------------------------

void Loader::Impl::AccrueRingFull(Clock::time_point now) {
  stats.ring_full_seconds += ring_full_waiters * Seconds(now - ring_full_mark);
  ring_full_mark = now;
}

void Loader::Impl::Tune(Clock::time_point now, uint32_t lead) {
  if (!auto_workers && !auto_prefetch) return;
  AccrueRingFull(now);  // idle time up to now belongs to this window, not the one it ends in
  const Tuner::Totals totals{stats.wait_seconds, stats.consumer_seconds,
                             stats.read + stats.decode + stats.collate, stats.ring_full_seconds,
                             static_cast<double>(completions)};
  TuneWindowFigures window;
  if (!tuner.OnBatch(totals, now, lead, &window)) return;
  const int before = active_workers;
  stats.tuning = tuner.Decide(window, static_cast<uint32_t>(ring_cap), &active_workers, &depth);
  if (active_workers > before) cv_work.notify_all();
  stats.workers = active_workers;
  stats.prefetch = static_cast<int>(depth);
}

// ---- Loader --------------------------------------------------------------------------------

Loader::Loader(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Loader::~Loader() {
  if (!impl_) return;
  if (!impl_->InOwnerProcess()) {
    // A forked copy: the workers, the lock and the ring belong to the parent. Touch nothing.
    new std::shared_ptr<Impl>(std::move(impl_));  // deliberately leaked
    return;
  }
  impl_->Shutdown();
}

namespace {

// The options as the loader runs them (Loader::options()): auto and 0 resolved to counts, and
// with normalize_on_device the workers' uint8 NHWC transform.
void ResolveOptions(const LoaderOptions& asked, Loader::Impl* impl) {
  impl->options = asked;
  impl->normalize_target = asked.transform;
  if (asked.normalize_on_device) {
    // The workers write uint8 NHWC; the kernel produces what was asked for on the device.
    TransformOptions& t = impl->options.transform;
    t.dtype = DType::kUint8;
    t.layout = Layout::kNHWC;
    t.mean = {0.f, 0.f, 0.f};
    t.std = {1.f, 1.f, 1.f};
  }
  if (asked.workers == LoaderOptions::kAutoWorkers) {
    impl->auto_workers = true;
    impl->options.workers =
        asked.max_workers > 0 ? static_cast<int>(asked.max_workers) : AvailableCpus();
  } else if (impl->options.workers <= 0) {
    impl->options.workers = AvailableCpus();
  }
  impl->active_workers = impl->auto_workers ? 1 : impl->options.workers;
}

std::unique_ptr<Sampler> MakeSampler(const format::Archive& archive, const LoaderOptions& o) {
  const uint64_t size = archive.size();
  SamplerOptions so;
  so.shuffle = o.shuffle;
  so.seed = o.seed;
  so.drop_last = o.drop_last;
  so.rank = o.rank;
  so.world_size = o.world_size;
  so.batch_size = o.batch_size;
  so.shuffle_block = o.shuffle_block;
  so.shuffle_window = o.shuffle_window == LoaderOptions::kAutoWindow ? 8 : o.shuffle_window;
  if (o.shuffle_by_shard) {  // shuffle="block"
    for (const auto& shard : archive.manifest().shards)
      so.shard_starts.push_back(shard.first_sample);
  }
  return std::make_unique<Sampler>(size, so);
}

std::unique_ptr<DeviceNormalize> MakeDeviceNormalize(const LoaderOptions& o, uint32_t h,
                                                     uint32_t w) {
  auto n = std::make_unique<DeviceNormalize>();
  n->dtype = o.transform.dtype;
  n->layout = o.transform.layout;
  n->plane = size_t{h} * w;
  n->max_samples = o.batch_size;
  const internal::Affine a = internal::AffineFor(o.transform);
  for (int c = 0; c < 3; ++c) n->scale[c] = a.scale[c], n->bias[c] = a.bias[c];
  return n;
}

}  // namespace

Result<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<const format::Archive> archive,
                                               const LoaderOptions& given,
                                               const CancelToken* cancel) {
  if (!archive) return Status::InvalidArgument("no archive");
  LoaderOptions options = given;
  if (options.transform.stats_from_archive) {  // mean="archive": the saved statistics
    if (options.transform.dtype == DType::kUint8) {
      return Status::InvalidArgument(
          "mean=\"archive\" normalises float outputs: give a float dtype (float32, float16 or "
          "bfloat16)");
    }
    // The caller's own options first: an error of theirs is not the file's.
    SF_RETURN_IF_ERROR(ValidateTransform(options.transform));
    SF_ASSIGN_OR_RETURN(const format::StatsRecord stats, format::ReadStatsRecord(*archive));
    for (int c = 0; c < 3; ++c) {
      options.transform.mean[c] = static_cast<float>(stats.mean[c]);
      options.transform.std[c] = static_cast<float>(stats.std[c]);
    }
    options.transform.stats_from_archive = false;
    // Figures a float32 normalisation cannot use (a std of 1e308 is finite as a double, not as
    // a float) are the file's damage, not the caller's mistake.
    if (Status st = ValidateTransform(options.transform); !st.ok()) {
      return Status::Corrupt(archive->path(), "/", format::kStatsFileName, ": ", st.message());
    }
  }
  SF_RETURN_IF_ERROR(ValidateLoaderOptions(options));
  if (options.device && !CudaAvailable()) {
    return Status::Unsupported("device copies requested but CUDA is unavailable: ",
                               CudaUnavailableReason());
  }
  // (Error paths drop `impl`, whose destructor stops anything started.)
  auto impl = std::make_shared<Impl>();
  impl->self = impl;
  impl->owner_pid = ::getpid();
  impl->archive = std::move(archive);
  ResolveOptions(options, impl.get());
  SF_RETURN_IF_ERROR(
      SampleDecoder::OutputShape(*impl->archive, options.transform, &impl->out_h, &impl->out_w));
  impl->sampler = MakeSampler(*impl->archive, options);
  SF_ASSIGN_OR_RETURN(const uint64_t selected, SelectFields(impl->archive->schema(), options));
  impl->fields = PlanFields(impl->archive->schema(), selected, impl->out_h, impl->out_w);
  SF_ASSIGN_OR_RETURN(
      impl->layout,
      LayOutSlot(impl->out_h, impl->out_w, DTypeSize(impl->options.transform.dtype),
                 options.batch_size, impl->fields.region_bytes, !impl->fields.empty()));
  SF_RETURN_IF_ERROR(impl->SizeRing(options));
  if (impl->archive->remote()) {  // the cache it needs; shuffle="block": the shard keeper
    std::shared_ptr<format::Archive> own;
    uint32_t downloads = 0;
    SF_RETURN_IF_ERROR(impl->PlanCache(&impl->options, &own, &downloads, cancel));
    impl->sampler = MakeSampler(*impl->archive, impl->options);
    if (own) {
      impl->keeper = std::make_unique<ShardKeeper>(own, impl->sampler.get(), options.world_size,
                                                   options.rank, downloads);
    }
  }
  Tuner::Config tc;
  tc.auto_workers = impl->auto_workers;
  tc.auto_prefetch = impl->auto_prefetch;
  tc.max_workers = impl->options.workers;
  tc.wait_target = options.wait_target;
  tc.batch_size = options.batch_size;
  impl->tuner = Tuner(tc);
  if (options.normalize_on_device) {
    impl->normalize = MakeDeviceNormalize(options, impl->out_h, impl->out_w);
  }
  if (options.mode == WorkerMode::kProcesses) {
    SF_RETURN_IF_ERROR(impl->StartProcesses());
  } else {
    SF_ASSIGN_OR_RETURN(impl->ring,
                        RingMemory::Reserve(impl->layout.slot_bytes, impl->slots.size()));
  }
  impl->ring_base = impl->ring.data();
  SF_RETURN_IF_ERROR(impl->MaintainRing());
  if (options.mode == WorkerMode::kThreads) SF_RETURN_IF_ERROR(impl->StartThreads());
  if (impl->keeper) {
    std::lock_guard<std::mutex> lock(impl->mu);
    for (uint32_t i = 0; i < impl->keeper->downloads(); ++i) {
      ++impl->threads_running;
      try {
        impl->threads.emplace_back([keep = impl->self.lock()] { keep->FetchAhead(); });
      } catch (const std::exception&) {
        // No thread to spare (system_error, bad_alloc): the workers fetch what they read
        // themselves (slower, not wrong).
        --impl->threads_running;
        break;
      }
    }
  }
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Status Loader::Impl::WaitForBatch(std::unique_lock<std::mutex>& lock, uint64_t b,
                                  const WaitHook& hook, Clock::time_point enter, int* slot,
                                  bool* starved) {
  int& s = *slot;
  auto ready = [&] {
    *starved = false;
    if (stopping || !fatal.ok()) return true;
    s = batch_slot(b);
    if (s >= 0 && slots[s].state == SlotState::kReady) return true;
    *starved = s < 0 && RingStarved();
    return *starved;
  };
  // Bounded wait: wake every poll interval for the hook, and give up after `timeout` seconds in
  // which no sample completed.
  const double poll = hook ? kWaitPollSeconds : 1.0;
  uint64_t seen = completions;
  auto progressed = enter;  // when a sample last completed, as far as this wait knows
  // A remote archive's download moving (bytes arriving from its location, in this process) is
  // progress too: a big shard from a slow store can take longer than the timeout while no
  // sample completes. (Other archives' downloads are not: they would hide a stall.)
  const storage::Remote* remote = archive->remote();
  uint64_t fetched = remote ? remote->BytesReceived() : 0;
  for (;;) {
    if (ready()) {
      if (!*starved || !fatal.ok() || stopping) break;
      if (!auto_prefetch || depth >= ring_cap) {
        // The consumer keeps every slot, the ring at its depth: a slot beyond it (kept_mb).
        SF_RETURN_IF_ERROR(AddKeptSlot(lock));
        continue;
      }
      // The consumer holds every slot: a deeper ring comes first (within its budget).
      ++depth;
      stats.tuning = "the consumer holds all " + std::to_string(usable) +
                     " slots: the ring grew to " + std::to_string(depth);
      lock.unlock();
      (void)MaintainRing();  // a slot that cannot be had lowers ring_cap: the error below
      lock.lock();
      continue;
    }
    const auto now = Clock::now();
    if (completions != seen) {
      seen = completions;
      progressed = now;
    }
    if (remote) {
      const uint64_t bytes = remote->BytesReceived();
      if (bytes != fetched) {
        fetched = bytes;
        progressed = now;
      }
    }
    if (options.timeout > 0) {
      const double idle = Seconds(now - progressed);
      if (idle >= options.timeout) return OnTimeout(idle);
    }
    cv_ready.wait_for(lock, std::chrono::duration<double>(poll));
    if (hook) {
      lock.unlock();
      Status h = hook();
      lock.lock();
      if (!h.ok()) return h;
    }
  }
  if (!fatal.ok()) return fatal;
  if (stopping) return Status::Cancelled("loader is shutting down");
  return Status::OK();
}

Batch Loader::Impl::Deliver(int s, uint64_t b) {
  const Slot& slot = slots[s];
  Batch batch;
  batch.images_ = SlotImages(s);
  batch.labels_ = SlotLabels(s);
  batch.indices_ = SlotIndices(s);
  batch.size_ = slot.count;
  batch.skipped_ = slot.skipped;
  batch.epoch_ = epoch;
  batch.number_ = b;
  batch.dtype_ = options.transform.dtype;
  const int64_t n = slot.count, h = out_h, w = out_w;
  batch.shape_ = options.transform.layout == Layout::kNCHW ? std::vector<int64_t>{n, 3, h, w}
                                                           : std::vector<int64_t>{n, h, w, 3};
  batch.device_dtype_ = batch.dtype_;
  batch.device_shape_ = batch.shape_;
  if (options.device) {
    batch.device_ = device_slots[s].get();
    if (options.normalize_on_device) {
      const TransformOptions& want = normalize_target;
      batch.device_dtype_ = want.dtype;
      batch.device_shape_ = want.layout == Layout::kNCHW ? std::vector<int64_t>{n, 3, h, w}
                                                         : std::vector<int64_t>{n, h, w, 3};
    }
    batch.device_label_offset_ = layout.labels_offset;
  }
  if (!fields.empty()) batch.fields_ = &slot_fields[s].views;
  return batch;
}

Result<Batch> Loader::Next(const WaitHook& hook) {
  Impl& p = *impl_;
  if (!p.InOwnerProcess()) return ForkedCopy(p.owner_pid);
  auto enter = Clock::now();
  std::unique_lock<std::mutex> lock(p.mu);
  if (!p.started) {
    lock.unlock();
    SF_RETURN_IF_ERROR(StartEpoch(0));
    lock.lock();
  }
  if (p.last_return != Clock::time_point()) {
    p.stats.consumer_seconds += Seconds(enter - p.last_return);
  }
  if (!p.fatal.ok()) return p.fatal;
  if (p.reread) {
    // The batch that failed, and those after it begun meanwhile, are read again (clears reread).
    p.BeginEpoch(p.sampler->Plan(p.epoch, p.current.plan.start), p.next_deliver, true);
    p.cv_work.notify_all();
  }
  if (p.next_deliver >= p.batches) {
    p.last_return = Clock::time_point();
    return Batch();
  }
  const uint64_t b = p.next_deliver;
  int s = -1;
  bool starved = false;
  SF_RETURN_IF_ERROR(p.WaitForBatch(lock, b, hook, enter, &s, &starved));
  Slot& slot = p.slots[s];
  slot.state = SlotState::kLeased;
  ++p.next_deliver;
  auto now = Clock::now();
  p.stats.wait_seconds += Seconds(now - enter);
  p.stats.seconds = Seconds(now - p.epoch_start);
  p.last_return = now;
  if (!slot.error.ok()) {
    Status err = slot.error;
    // A remote archive's read error may pass (the network, the server down): not consumed
    // (loader.h, Next). A local one (a shard file gone, unreadable) fails the same way each time.
    const StatusCode code = err.code();
    const bool remote =
        p.archive->remote() != nullptr || Failpoints::Get().io_error_once != Failpoints::kOff;
    if (remote && (code == StatusCode::kIOError || code == StatusCode::kTimeout)) {
      --p.next_deliver;
      p.reread = true;
    }
    lock.unlock();
    p.ReleaseSlot(s);
    return err;
  }
  ++p.stats.batches;
  p.stats.images += slot.count;
  p.stats.skipped += slot.skipped;
  uint32_t lead = 0;  // ready batches to spare (only the ring's tuner reads it)
  if (p.auto_prefetch) {
    for (size_t x = 0; x < p.slot_end; ++x) lead += p.slots[x].state == SlotState::kReady;
  }
  const uint32_t depth_before = p.depth;
  p.Tune(now, lead);
  const bool maintain = p.depth != depth_before || !p.retiring.empty();
  Batch batch = p.Deliver(s, b);
  lock.unlock();
  if (maintain) (void)p.MaintainRing();  // a failure is in stats().tuning
  if (!p.fields.empty()) {
    // The slot is leased: its fields' buffers are this thread's until the lease ends.
    const auto t = Clock::now();
    Status gathered = GatherFields(*p.archive, p.fields, p.layout, p.SlotBase(s), batch.size(),
                                   &p.slot_fields[s]);
    lock.lock();
    p.stats.collate += Seconds(Clock::now() - t);
    p.KeeperUnholdSlot(s);  // its shards were held for this gather (shard_keeper.h)
    lock.unlock();
    if (!gathered.ok()) {
      p.ReleaseSlot(s);
      return gathered;
    }
  }
  batch.lease_ = p.Lease(s);
  return batch;
}

EpochStats Loader::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EpochStats s = impl_->stats;
  for (size_t x = 0; x < impl_->slot_end; ++x) {
    s.ready_batches += impl_->slots[x].state == SlotState::kReady;
  }
  const storage::FetchStats now = storage::GetFetchStats(), &base = impl_->fetch_base;
  s.bytes_fetched = now.bytes_fetched - base.bytes_fetched;
  s.cache_hits = now.hits - base.hits;
  s.cache_misses = now.misses - base.misses;
  s.fetch_wait_seconds = impl_->fetch_wait_ns.load(std::memory_order_relaxed) * 1e-9;
  return s;
}

uint64_t Loader::batches_per_epoch() const { return impl_->sampler->batches_per_epoch(); }
uint64_t Loader::samples_per_epoch() const {
  const auto& o = impl_->options;
  return o.drop_last ? batches_per_epoch() * o.batch_size : impl_->sampler->samples_per_rank();
}
const LoaderOptions& Loader::options() const { return impl_->options; }
uint32_t Loader::out_height() const { return impl_->out_h; }
uint32_t Loader::out_width() const { return impl_->out_w; }
PinKind Loader::pin_kind() const { return impl_->ring.kind(); }
bool Loader::on_device() const { return impl_->options.device; }
std::vector<int> Loader::worker_pids() const {
  std::vector<int> pids;
  for (const auto& c : impl_->children) pids.push_back(c.pid);
  return pids;
}

}  // namespace shardfeed::reader
