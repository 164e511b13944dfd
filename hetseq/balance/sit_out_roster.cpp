#include "hetseq/balance/sit_out_roster.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/channel/group_channel.h"
#include "hetseq/train/controller.h"

namespace hetseq {

// Note [Sharing an update]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A rank at 0 in the split (Note [Sitting out]) must cost the others nothing: no forward, no backward, no
// chunk of the reduction, no collective it has to reach. So the ranks that take part (the members) run each
// update among themselves:
// - the gradient buckets are summed over the members only: through shared memory, the chunks go to the
//   members and the barrier counts them (SharedMemoryReduce::set_members); over Gloo, the comm hook
//   allreduces over a process group of the members (World::subgroup, made once per set of members and kept);
// - the update's statistics, the stop vote and the observers' gathers go over a channel on that group. The
//   balancer's gather carries the figures the ranks that sit out posted on the store, read by rank 0 and
//   handed to the others inside its own row, so every member solves the same split from the same numbers;
// - the data plan gives the members the whole chunk (Note [Data plan]); the weighting stays exact, since G and
//   S of Note [Weighted averaging] are sums over the samples used, whoever computed them.
// Rank 0 always takes part: it writes the checkpoints and the log, and its state is what the others take.
//
// A rank that sits out waits on the store, not in a collective: every `poll` it looks for the next call
// ("sit-out/meeting/K", K the number of calls so far, which every rank counts alike), and now and then it
// probes itself (Controller::probe: micro-batches back to back for probe_s, so that a rank held to a share of
// a CPU shows its sustained speed, not one burst) and posts the balancer's figures. A probe ends early when a call
// comes: it looks for one after each micro-batch, so a save or the epoch's end waits for the rank at most one
// micro-batch of its probe (one or two of its shares), never the probe's whole length. It is called when every
// rank is needed after an update: a save, the epoch's end, a stop, the update limit, or a split that takes it
// back. The call names the update, the data's position, the stop and the split; the rank stands there, takes
// rank 0's training state in one broadcast over the whole group (the same bytes as a checkpoint, Controller::
// state and load_state), and goes on with the others through whatever comes next (the save, the validation,
// the epoch's end) before it sits out again, or trains. So a save, a validation and a resume see the same
// model on every rank, and a rank taken back trains from exactly where the others are.
//
// A rank that leaves needs no call: it took part in the update whose re-plan gave it 0, and it sits out from the
// update after (from this process's third, since the c10d::Reducer settles its buckets over the whole group at
// the start of the second: a resumed split with a rank at 0 has it run empty micro-batches until then).
// Only members create a group, at a point all of them reach; a rank that sits out never waits in a collective that the others may
// not reach for long. It does wait for rank 0: rank 0 beats a counter on the store about once a second while
// anyone sits out, and a rank that sees no beat for --distributed-timeout fails as a lost peer.
//
// Not where sitting out would need every rank in each update: --find-unused-parameters (the c10d::Reducer
// allreduces the used parameters over the whole group), PowerSGD (every rank keeps error feedback), and
// --zero-sharding (every rank steps its shard of the optimizer).

namespace {

constexpr const char* kMeetingKey = "sit-out/meeting/";
constexpr const char* kFiguresKey = "sit-out/figures/";
constexpr const char* kBeatKey = "sit-out/beat";
constexpr const char* kStopKey = "sit-out/stop";    // Note [A stop while sitting out]
constexpr const char* kAliveKey = "sit-out/alive/";  // + rank: a rank that sits out counts its waits' seconds

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string numbers_text(const std::vector<double>& values) {
  std::vector<std::string> parts;
  for (double v : values) parts.push_back(fmt::format("{:.17g}", v));
  return fmt::format("{}", fmt::join(parts, " "));
}

std::vector<double> numbers_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<double> out;
  for (double v; in >> v;) out.push_back(v);
  return out;
}

}  // namespace

SitOutRoster::SitOutRoster(World& world, PlanSchedule& schedule, std::shared_ptr<DistributedReducer> reducer,
                           std::shared_ptr<CollectiveChannel> channel, std::shared_ptr<Dataset> train_data,
                           SitOutOptions options)
    : world_(world),
      schedule_(schedule),
      reducer_(std::move(reducer)),
      channel_(std::move(channel)),
      data_(std::move(train_data)),
      options_(options),
      rank_(world.rank()),
      world_size_(world.world_size()) {
  HETSEQ_ASSERT(reducer_ && reducer_->sits_out_supported() && world_.store(), "SitOutRoster without its parts");
  for (int64_t r = 0; r < world_size_; ++r) members_.push_back(r);
  position_ = rank_;
  next_probe_ = last_beat_ = std::chrono::steady_clock::now();
}

std::vector<int64_t> SitOutRoster::members_of(int64_t epoch) const {
  const DataPlan plan = schedule_.train_plan(epoch);
  std::vector<int64_t> members;
  for (int64_t r = 0; r < plan.world_size(); ++r) {
    if (!plan.sits_out(r)) members.push_back(r);
  }
  return members;
}

std::shared_ptr<CollectiveChannel> SitOutRoster::channel_of(const std::vector<int64_t>& members) {
  if (static_cast<int64_t>(members.size()) == world_size_) return channel_;
  auto& kept = channels_[members];
  if (!kept) {
    kept = std::make_shared<GroupChannel>(world_.subgroup(members), world_.device(), options_.fast_stat_sync,
                                          options_.host_group ? world_.host_group(members) : nullptr);
  }
  return kept;
}

void SitOutRoster::apply(Controller& controller, const std::vector<int64_t>& members) {
  if (members == members_) return;
  alive_.clear();  // Note [A stop while sitting out]: every rank's clock restarts
  HETSEQ_ASSERT(!members.empty() && members.front() == 0, "rank 0 sits out in [{}]", fmt::join(members, ","));
  const auto at = std::find(members.begin(), members.end(), rank_);
  const bool was_member = position_ >= 0;
  position_ = at == members.end() ? -1 : at - members.begin();
  if (position_ >= 0) {
    const bool all = static_cast<int64_t>(members.size()) == world_size_;
    reducer_->set_members(members, all ? nullptr : world_.subgroup(members));
    controller.set_update_channel(channel_of(members));
  } else {
    reducer_->set_members(members, nullptr);
  }
  members_ = members;
  if (was_member && position_ < 0) {
    post_figures();  // the balancer's figures from its updates, until its probes replace them
    next_probe_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  }
}

void SitOutRoster::before_update() {
  everyone_ = static_cast<int64_t>(members_.size()) == world_size_;
}

void SitOutRoster::after_update(Controller& controller, const Meeting& here, bool everyone) {
  const int64_t share = schedule_.train_plan(here.epoch).share(rank_);
  if (share > 0) share_ = share;  // 0: this update's re-plan took it out
  const std::vector<int64_t> before = members_;
  const std::vector<int64_t> now = members_of(here.epoch);
  const bool someone_out = static_cast<int64_t>(before.size()) < world_size_;
  const bool taken_back = std::any_of(now.begin(), now.end(), [&](int64_t r) {
    return std::find(before.begin(), before.end(), r) == before.end();
  });
  auto store = world_.store();
  if (someone_out && (everyone || taken_back)) {
    if (rank_ == 0) {
      std::vector<int64_t> out;
      for (int64_t r = 0; r < world_size_; ++r) {
        if (std::find(before.begin(), before.end(), r) == before.end()) out.push_back(r);
      }
      log::info("[balance] after update {}: rank(s) {} called back to the others ({})", here.num_updates,
                fmt::join(out, ","), taken_back ? "taken back" : "a save, a validation, the epoch's end or a stop");
      const DataPlan plan = schedule_.train_plan(here.epoch);
      std::vector<double> call{static_cast<double>(here.epoch), static_cast<double>(here.num_updates),
                               static_cast<double>(here.index_in_epoch), static_cast<double>(here.next.epoch),
                               static_cast<double>(here.next.offset), here.stop ? 1.0 : 0.0};
      for (int64_t r = 0; r < world_size_; ++r) call.push_back(static_cast<double>(plan.share(r)));
      for (int64_t r = 0; r < world_size_; ++r) call.push_back(static_cast<double>(plan.update_freqs[r]));
      store->set(fmt::format("{}{}", kMeetingKey, meetings_), bytes_of(numbers_text(call)));
    }
    ++meetings_;
    meet(controller, /*receiving=*/false);
  } else if (someone_out && rank_ == 0 && std::chrono::steady_clock::now() - last_beat_ > std::chrono::seconds(1)) {
    last_beat_ = std::chrono::steady_clock::now();
    visit_store(*store);
  }
  // The c10d::Reducer settles its buckets over the whole group at the start of this process's second update:
  // until then a rank at 0 takes part with an empty micro-batch (Note [Empty micro-batches]).
  if (++updates_ >= 2) apply(controller, now);
  everyone_ = true;  // whatever follows this update before the next one (a save, the epoch's end) has every rank
}

// Note [A stop while sitting out]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stop signal reaches one node when its node alone is preempted, and Slurm's grace between SIGTERM and SIGKILL
// is 30 s by default. A rank that takes part votes to stop in its next update (Note [Clean stops]); a rank
// that sits out votes in no update, and the next meeting may be minutes away. So, while it waits, it writes
// its rank under kStopKey on the store; rank 0 looks for that key on its visits to the store, about once a
// second after an update, where it also beats (visit_store), and votes to stop in its next update when it finds
// it. The stop is then the usual
// one: every rank agrees after that update, the ranks that sit out are called to the meeting (with stop set),
// rank 0 saves, and every rank exits with kExitStopped: within about one update and a save of the signal. A
// probe in progress on the rank delays its key by at most one micro-batch.
//
// A rank that sits out and dies (SIGKILL, its node lost) would be missed until the next meeting, which may be
// minutes away. So a waiting rank also counts under kAliveKey + its rank, about once a second, and rank 0, on
// the same visits to the store, throws a PeerError naming a rank whose count has not moved for
// --distributed-timeout; every rank then stops with kExitPeerLost (the others when their next collective with
// rank 0 fails). The clock of a rank restarts whenever the ranks that take part change (a meeting, a split).

void SitOutRoster::visit_store(c10d::Store& store) {
  try {
    store.set(kBeatKey, bytes_of(std::to_string(++beats_)));
    check_alive(store, last_beat_);
    if (!stop_heard_ && store.check({kStopKey})) {
      stop_heard_ = true;
      log::info("[balance] rank {}, which sits out, was asked to stop: the run stops after the next update",
                string_of(store.get(kStopKey)));
    }
  } catch (const PeerError&) {
    throw;
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank 0 of {}: the store of the run failed while it beat for the ranks that sit out "
                                "and looked for their stop requests: {}",
                                world_size_, e.what()));
  }
}

void SitOutRoster::count_alive() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_alive_ < std::chrono::seconds(1)) return;
  last_alive_ = now;
  try {
    world_.store()->set(kAliveKey + std::to_string(rank_), bytes_of(std::to_string(++alive_count_)));
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank {} of {} (sitting out): the store of the run failed: {} (rank 0 died or the "
                                "rendezvous is gone)",
                                rank_, world_size_, e.what()));
  }
}

void SitOutRoster::check_alive(c10d::Store& store, std::chrono::steady_clock::time_point now) {
  for (int64_t r = 1; r < world_size_; ++r) {
    if (is_member(r)) continue;
    const std::string key = kAliveKey + std::to_string(r);
    std::string count = store.check({key}) ? string_of(store.get(key)) : std::string();
    auto [it, added] = alive_.try_emplace(r, Heard{count, now});
    if (added || it->second.count != count) {
      it->second = Heard{std::move(count), now};
      continue;
    }
    if (now - it->second.at > options_.timeout) {
      throw PeerError(fmt::format(
          "rank 0 of {}: rank {}, which sits out, has not been heard from for {} s (--distributed-timeout): it died "
          "or hangs; the run stops, resume it from the last checkpoint",
          world_size_, r, std::chrono::duration_cast<std::chrono::seconds>(options_.timeout).count()));
    }
  }
}

Meeting SitOutRoster::wait(Controller& controller) {
  everyone_ = false;
  auto store = world_.store();
  const std::string key = fmt::format("{}{}", kMeetingKey, meetings_);
  using Clock = std::chrono::steady_clock;
  Clock::time_point heard = Clock::now();
  std::string last_beat;
  std::vector<double> call;
  for (;;) {
    try {
      count_alive();
      if (!stop_posted_ && options_.stop_requested && options_.stop_requested()) {
        stop_posted_ = true;
        store->set(kStopKey, bytes_of(std::to_string(rank_)));
        log::info("[balance] rank {} of {} sits out and was asked to stop: rank 0 stops the run", rank_, world_size_);
      }
      if (store->check({key})) {
        call = numbers_of(string_of(store->get(key)));
        break;
      }
      if (store->check({kBeatKey})) {
        const std::string beat = string_of(store->get(kBeatKey));
        if (beat != last_beat) {
          last_beat = beat;
          heard = Clock::now();
        }
      }
    } catch (const std::exception& e) {
      throw PeerError(fmt::format("rank {} of {} (sitting out): the store of the run failed while it waited to be "
                                  "called back: {} (rank 0 died or the rendezvous is gone)",
                                  rank_, world_size_, e.what()));
    }
    if (Clock::now() - heard > options_.timeout) {
      throw PeerError(fmt::format("rank {} of {} (sitting out): rank 0 has not been heard from for {} s "
                                  "(--distributed-timeout): it died, or the ranks that train hang",
                                  rank_, world_size_,
                                  std::chrono::duration_cast<std::chrono::seconds>(options_.timeout).count()));
    }
    if (balancer_ && Clock::now() >= next_probe_) probe(controller);
    std::this_thread::sleep_for(options_.poll);
  }
  const auto w = static_cast<size_t>(world_size_);
  HETSEQ_ASSERT(call.size() == 6 + 2 * w, "a call of {} numbers for {} ranks", call.size(), w);
  ++meetings_;
  Meeting m;
  m.epoch = static_cast<int64_t>(call[0]);
  m.num_updates = static_cast<int64_t>(call[1]);
  m.index_in_epoch = static_cast<int64_t>(call[2]);
  m.next = IteratorPosition{static_cast<int64_t>(call[3]), static_cast<int64_t>(call[4])};
  m.stop = call[5] != 0;
  std::vector<int64_t> shares, micro_batches;
  for (size_t r = 0; r < w; ++r) shares.push_back(static_cast<int64_t>(call[6 + r]));
  for (size_t r = 0; r < w; ++r) micro_batches.push_back(static_cast<int64_t>(call[6 + w + r]));
  if (schedule_.train_plan(m.epoch).all_shares() != shares) schedule_.set_shares(m.epoch, shares, micro_batches);
  meet(controller, /*receiving=*/true);
  apply(controller, members_of(m.epoch));
  everyone_ = true;
  return m;
}

void SitOutRoster::meet(Controller& controller, bool receiving) {
  torch::NoGradGuard no_grad;
  auto group = world_.group();
  std::vector<char> bytes;
  if (rank_ == 0) {
    Checkpoint state;
    static_cast<TrainingState&>(state) = controller.state();
    bytes = encode_checkpoint(state);
  }
  const std::string source = fmt::format("rank 0's training state, at update {}", controller.num_updates());
  try {
    std::vector<at::Tensor> size{torch::full({1}, static_cast<int64_t>(bytes.size()), torch::kLong)};
    group->broadcast(size)->wait();
    bytes.resize(static_cast<size_t>(size[0].item<int64_t>()));
    std::vector<at::Tensor> data{torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kByte)};
    group->broadcast(data)->wait();
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank {} of {}: the ranks that sat out were called back after update {}, and the "
                                "broadcast of {} failed: {} (a peer died or fell behind past the timeout)",
                                rank_, world_size_, controller.num_updates(), source, e.what()));
  }
  if (!receiving) return;
  const Checkpoint state = decode_checkpoint(bytes, source);
  load_model_tensors(controller.model(), state.model, source);
  controller.load_state(state, ResumeOptions{}, source);
}

void SitOutRoster::post_figures() {
  if (!balancer_) return;
  world_.store()->set(fmt::format("{}{}", kFiguresKey, rank_), bytes_of(numbers_text(balancer_->figures())));
}

// Note [Sharing an update]: micro-batches of the share it last had and of twice that, in turn (so that the
// fit can tell its fixed cost from its cost per sample), back to back for probe_s.
void SitOutRoster::probe(Controller& controller) {
  int64_t size = probes_++ % 2 == 0 ? share_ : 2 * share_;
  size = std::min(size, data_->size());
  std::vector<int64_t> indices(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) indices[static_cast<size_t>(i)] = i;
  const Batch batch = data_->collate(indices);
  const auto start = std::chrono::steady_clock::now();
  int64_t runs = 0;
  double seconds = 0;
  const std::string call = fmt::format("{}{}", kMeetingKey, meetings_);
  bool called = false;
  do {
    controller.probe(batch);
    count_alive();  // a probe's micro-batch may take seconds on a starved rank
    ++runs;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Called meanwhile (a save, the epoch's end, a stop): the others wait for no more than this micro-batch.
    called = world_.store()->check({call});
  } while (seconds < options_.probe_s && !called);
  balancer_->add_probe(CostSample{size, 1, seconds / static_cast<double>(runs)});
  post_figures();
  const double spacing = std::max(1.0, options_.probe_spacing * seconds);
  next_probe_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                      std::chrono::duration<double>(spacing));
  log::debug("[balance] rank {} (sitting out): probe of {} micro-batch(es) of {} samples, {:.1f} ms each", rank_, runs,
             size, 1e3 * seconds / static_cast<double>(runs));
}

bool SitOutRoster::is_member(int64_t rank) const {
  return std::find(members_.begin(), members_.end(), rank) != members_.end();
}

GatherFn SitOutRoster::gather(bool posted) {
  return [this, posted](const std::vector<double>& local) { return gather_rows(local, posted); };
}

std::vector<std::vector<double>> SitOutRoster::gather_rows(const std::vector<double>& local, bool posted) {
  if (everyone_) return channel_->gather(local);
  HETSEQ_ASSERT(position_ >= 0, "rank {} gathers while it sits out", rank_);
  const size_t k = local.size(), w = static_cast<size_t>(world_size_);
  std::vector<double> row = local;
  if (posted) row.resize(k + w * k, 0.0);
  if (posted && rank_ == 0) {
    auto store = world_.store();
    for (size_t r = 0; r < w; ++r) {
      if (is_member(static_cast<int64_t>(r))) continue;
      const std::string key = fmt::format("{}{}", kFiguresKey, r);
      if (!store->check({key})) continue;
      const std::vector<double> figures = numbers_of(string_of(store->get(key)));
      if (figures.size() == k) std::copy(figures.begin(), figures.end(), row.begin() + static_cast<long>(k + r * k));
    }
  }
  const std::vector<std::vector<double>> rows = channel_of(members_)->gather(row);  // [member]
  std::vector<std::vector<double>> all(w, std::vector<double>(k, 0.0));
  for (size_t i = 0; i < members_.size(); ++i) {
    all[static_cast<size_t>(members_[i])].assign(rows[i].begin(), rows[i].begin() + static_cast<long>(k));
  }
  if (posted) {
    for (size_t r = 0; r < w; ++r) {
      if (is_member(static_cast<int64_t>(r))) continue;
      all[r].assign(rows[0].begin() + static_cast<long>(k + r * k), rows[0].begin() + static_cast<long>(k + r * k + k));
    }
  }
  return all;
}

}  // namespace hetseq
