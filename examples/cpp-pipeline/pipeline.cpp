// A ZeroMQ pipeline in C++ (cppzmq) whose every process answers flowstat's control channel through
// libflowstat-node: source -> 2 workers -> merger -> sink, over PUSH/PULL, one process each.
//
//   pipeline run [options]                 all five, as child processes, data over ipc:// in --dir
//   pipeline source|worker|merger|sink [options]   one of them
//
// See README.md beside this file for the options and what a flowstat agent sees.
#include <flowstat/node.h>

#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_signalled = 0;
void on_signal(int) { g_signalled = 1; }

// What travels: a header, then padding up to --size bytes. A sender stamps t_sent (Unix seconds)
// when it sends; the reader's input latency is the time it takes it minus that stamp.
struct Header {
    double t_sent;
    uint64_t seq;
    uint32_t eos;      // 1: end of stream, no object
    uint32_t objects;  // the objects merged into this one (1 for a source object)
};

struct Options {
    std::string role, id, pull, push, run_id, bind, dir = "/tmp/flowstat-pipeline";
    std::string upstream;  // the stages that feed this one (run says it): the pipeline's edges
    std::string slow;      // --slow STAGE: that stage (its id, or its role) costs --slow-us of CPU an object
    long count = 10000, rate = 1000, size = 256, workers = 2, batch = 2;
    long merge_cost_us = 0, work_us = 0, sndhwm = 1000, rcvhwm = 1000, slow_us = 1000;
    bool blocking() const { return !slow.empty(); }  // a slow stage holds its senders: they block
};

constexpr int SEND_TIMEOUT_MS = 100;  // a blocking send looks at a stop request this often

double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void busy_for(long us) {
    auto end = Clock::now() + std::chrono::microseconds(us);
    while (Clock::now() < end) {
    }
}

// CPU time of this thread, spent on purpose: as slow on any machine (a wall-clock wait would not be).
void burn_cpu_us(long us) {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    long long end = now.tv_sec * 1000000000LL + now.tv_nsec + us * 1000LL;
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    while (now.tv_sec * 1000000000LL + now.tv_nsec < end);
}

// What each object costs this stage beyond its own work: --slow-us when --slow names it.
long slow_cost_us(const Options &o) { return o.slow == o.id || o.slow == o.role ? o.slow_us : 0; }

bool parse(int argc, char **argv, Options &o) {
    if (argc < 2) return false;
    o.role = argv[1];
    std::map<std::string, std::string *> texts = {{"--id", &o.id},         {"--pull", &o.pull},
                                                  {"--push", &o.push},     {"--run-id", &o.run_id},
                                                  {"--control", &o.bind},  {"--dir", &o.dir},
                                                  {"--upstream", &o.upstream}, {"--slow", &o.slow}};
    std::map<std::string, long *> numbers = {
        {"--count", &o.count},   {"--rate", &o.rate},          {"--size", &o.size},
        {"--workers", &o.workers}, {"--batch", &o.batch},      {"--merge-cost-us", &o.merge_cost_us},
        {"--work-us", &o.work_us}, {"--sndhwm", &o.sndhwm},    {"--rcvhwm", &o.rcvhwm},
        {"--slow-us", &o.slow_us}};
    for (int i = 2; i + 1 < argc; i += 2) {
        if (texts.count(argv[i]))
            *texts[argv[i]] = argv[i + 1];
        else if (numbers.count(argv[i]))
            *numbers[argv[i]] = std::atol(argv[i + 1]);
        else
            return false;
    }
    if (o.id.empty()) o.id = o.role;
    o.size = std::max<long>(o.size, sizeof(Header));
    o.batch = std::max<long>(o.batch, 1);
    return argc % 2 == 0;
}

// The node of this process: its control channel, announced in $FLOWSTAT_ENDPOINTS_DIR when set.
fs_node *open_node(const Options &o, const char *role, bool has_input, bool has_output) {
    fs_node_options options = FS_NODE_OPTIONS_INIT;
    options.node_id = o.id.c_str();
    options.role = role;
    options.run_id = o.run_id.empty() ? nullptr : o.run_id.c_str();
    options.bind = o.bind.empty() ? nullptr : o.bind.c_str();
    options.receive_buffer_size = has_input ? o.rcvhwm : -1;
    options.send_buffer_size = has_output ? o.sndhwm : -1;
    options.upstream = o.upstream.empty() ? nullptr : o.upstream.c_str();  // flowstat: who feeds it
    char why[256];
    fs_node *node = fs_node_open(&options, why, sizeof why);
    if (!node) std::fprintf(stderr, "%s: %s\n", o.id.c_str(), why);
    return node;
}

// zmq_poll, a signal (SIGTERM: stop) reading as "nothing yet" rather than an error.
int poll_for(zmq::pollitem_t *items, size_t n, long ms) {
    int rc = zmq_poll(items, static_cast<int>(n), ms);
    return rc < 0 && zmq_errno() == EINTR ? 0 : rc;
}

bool stopping(fs_node *node) { return g_signalled || fs_node_stop_requested(node); }

zmq::message_t make_object(const Options &o, uint64_t seq, uint32_t objects, bool eos = false) {
    zmq::message_t msg(eos ? sizeof(Header) : static_cast<size_t>(o.size));
    std::memset(msg.data(), 0, msg.size());
    Header h{unix_now(), seq, eos ? 1u : 0u, objects};
    std::memcpy(msg.data(), &h, sizeof h);
    return msg;
}

// Send without blocking; a full buffer is told to the node (an overload episode) and the send
// retried until it goes or the node is stopped. With --slow, sends block (as a plain zmq send
// does): the node is backpressured while one waits (SNDTIMEO: it looks at a stop request).
bool send_object(zmq::socket_t &out, zmq::message_t msg, fs_node *node, bool blocking = false) {
    size_t size = msg.size();
    for (;;) {
        if (blocking) fs_node_sending(node);  // flowstat: a send that may wait
        if (out.send(msg, blocking ? zmq::send_flags::none : zmq::send_flags::dontwait)) {
            fs_node_sent(node, 1, size);
            return true;
        }
        if (blocking) {
            if (stopping(node)) return false;
            continue;
        }
        fs_node_send_refused(node);
        zmq::pollitem_t item{out.handle(), 0, ZMQ_POLLOUT, 0};
        poll_for(&item, 1, 100);
        if (stopping(node)) return false;
    }
}

zmq::socket_t socket(zmq::context_t &ctx, zmq::socket_type type, const Options &o) {
    zmq::socket_t s(ctx, type);
    s.set(zmq::sockopt::sndhwm, static_cast<int>(o.sndhwm));
    s.set(zmq::sockopt::rcvhwm, static_cast<int>(o.rcvhwm));
    s.set(zmq::sockopt::linger, 2000);
    if (o.blocking()) s.set(zmq::sockopt::sndtimeo, SEND_TIMEOUT_MS);
    return s;
}

// Read what is queued, up to a batch of 256 at a time: a full batch means input was waiting (the
// node is behind, or about to be). The node is told once per cycle: the objects, their bytes, and
// their send stamps (their waits, the clock read once for all).
template <typename Take>
bool read_cycle(zmq::socket_t &in, fs_node *node, Take take) {
    zmq::pollitem_t item{in.handle(), 0, ZMQ_POLLIN, 0};
    if (poll_for(&item, 1, 0) <= 0) {  // nothing waiting: the node waits for its input
        fs_node_waiting(node);          // flowstat: idle until the next fs_node_received
        if (poll_for(&item, 1, 100) <= 0) return true;
    }
    int taken = 0;
    uint64_t bytes = 0;
    std::vector<double> stamps;
    zmq::message_t msg;
    bool going = true;
    while (going && taken < 256 && zmq_msg_recv(msg.handle(), in.handle(), ZMQ_DONTWAIT) >= 0) {
        Header h;
        std::memcpy(&h, msg.data(), sizeof h);
        if (!h.eos) {
            stamps.push_back(h.t_sent);
            bytes += msg.size();
        }
        taken++;
        going = take(h, msg);
    }
    fs_node_received(node, stamps.size(), bytes);
    fs_node_latencies(node, stamps.data(), stamps.size());
    fs_node_input_backlog(node, taken == 256);
    return going;
}

std::vector<std::string> split(const std::string &list) {
    std::vector<std::string> parts;
    for (size_t at = 0, comma; at <= list.size(); at = comma + 1) {
        comma = std::min(list.find(',', at), list.size());
        parts.push_back(list.substr(at, comma - at));
    }
    return parts;
}

// The source deals its objects to its workers itself, one PUSH socket each (to the first that takes
// it, in turn), so that each worker gets an end-of-stream marker of its own.
bool send_to_any(std::vector<zmq::socket_t> &outs, size_t &next, zmq::message_t msg, fs_node *node,
                 bool blocking) {
    if (blocking) {  // in turn, each send waiting for its worker (--slow)
        bool sent = send_object(outs[next], std::move(msg), node, true);
        next = (next + 1) % outs.size();
        return sent;
    }
    size_t size = msg.size();
    for (;;) {
        for (size_t k = 0; k < outs.size(); k++) {
            zmq::socket_t &out = outs[(next + k) % outs.size()];
            if (out.send(msg, zmq::send_flags::dontwait)) {
                fs_node_sent(node, 1, size);
                next = (next + k + 1) % outs.size();
                return true;
            }
        }
        fs_node_send_refused(node);
        std::vector<zmq::pollitem_t> items;
        for (auto &out : outs) items.push_back({out.handle(), 0, ZMQ_POLLOUT, 0});
        poll_for(items.data(), items.size(), 100);
        if (stopping(node)) return false;
    }
}

int run_source(const Options &o, zmq::context_t &ctx) {
    fs_node *node = open_node(o, "producer", false, true);
    std::vector<zmq::socket_t> outs;
    for (const auto &endpoint : split(o.push)) {
        outs.push_back(socket(ctx, zmq::socket_type::push, o));
        outs.back().connect(endpoint);
    }
    size_t next = 0;
    auto start = Clock::now();
    for (long seq = 0; seq < o.count && !stopping(node); seq++) {
        if (o.rate > 0) std::this_thread::sleep_until(start + std::chrono::microseconds(seq * 1000000 / o.rate));
        if (!send_to_any(outs, next, make_object(o, seq, 1), node, o.blocking())) break;
    }
    for (auto &out : outs) send_object(out, make_object(o, 0, 0, true), node, o.blocking());
    fs_node_close(node);
    return 0;
}

int run_worker(const Options &o, zmq::context_t &ctx) {
    fs_node *node = open_node(o, "worker", true, true);
    zmq::socket_t in = socket(ctx, zmq::socket_type::pull, o), out = socket(ctx, zmq::socket_type::push, o);
    in.bind(o.pull);
    out.connect(o.push);
    bool ended = false;
    while (!ended && !stopping(node)) {
        read_cycle(in, node, [&](const Header &h, zmq::message_t &msg) {
            if (h.eos) {
                ended = true;
                return send_object(out, make_object(o, 0, 0, true), node, o.blocking());
            }
            busy_for(o.work_us);
            burn_cpu_us(slow_cost_us(o));
            Header forwarded = h;
            forwarded.t_sent = unix_now();  // this hop's send
            std::memcpy(msg.data(), &forwarded, sizeof forwarded);
            return send_object(out, std::move(msg), node, o.blocking());
        });
    }
    fs_node_close(node);
    return 0;
}

int run_merger(const Options &o, zmq::context_t &ctx) {
    fs_node *node = open_node(o, "merger", true, true);
    zmq::socket_t in = socket(ctx, zmq::socket_type::pull, o), out = socket(ctx, zmq::socket_type::push, o);
    in.bind(o.pull);
    out.connect(o.push);
    long held = 0, ends = 0;
    uint64_t merged_seq = 0, checksum = 0;
    auto merge = [&]() {
        auto t0 = Clock::now();
        busy_for(o.merge_cost_us);  // the merge's work: what --merge-cost-us makes dearer
        burn_cpu_us(held * slow_cost_us(o));
        fs_node_merged(node, held, std::chrono::duration<double>(Clock::now() - t0).count());
        auto objects = static_cast<uint32_t>(held);
        held = 0;
        return send_object(out, make_object(o, merged_seq++, objects), node, o.blocking());
    };
    bool ok = true;
    while (ok && ends < o.workers && !stopping(node)) {
        ok = read_cycle(in, node, [&](const Header &h, zmq::message_t &msg) {
            if (h.eos) {
                ends++;
                return true;
            }
            checksum += static_cast<const unsigned char *>(msg.data())[msg.size() - 1];
            return ++held < o.batch || merge();
        });
    }
    fs_node_set_state(node, FS_NODE_DRAINING);
    if (ok && held) merge();
    send_object(out, make_object(o, 0, 0, true), node, o.blocking());
    fs_node_close(node);
    return checksum == 0 ? 0 : 1;  // the padding is zeros: anything else came garbled
}

int run_sink(const Options &o, zmq::context_t &ctx) {
    fs_node *node = open_node(o, "sink", true, false);
    zmq::socket_t in = socket(ctx, zmq::socket_type::pull, o);
    in.bind(o.pull);
    bool ended = false;
    uint64_t objects = 0;
    while (!ended && !stopping(node)) {
        read_cycle(in, node, [&](const Header &h, zmq::message_t &) {
            ended = h.eos != 0;
            if (!ended) busy_for(o.work_us);
            if (!ended) burn_cpu_us(slow_cost_us(o));
            objects += h.objects;
            return !ended;
        });
    }
    fs_node_close(node);
    std::printf("sink: %llu source objects arrived, merged\n", static_cast<unsigned long long>(objects));
    return 0;
}

// -- pipeline run: the five processes, each this program ------------------------------------------

pid_t spawn(const std::vector<std::string> &args) {
    std::vector<char *> argv;
    for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) return -1;
    return pid;
}

int run_all(const Options &o, int argc, char **argv) {
    std::string at = "ipc://" + o.dir + "/";
    std::vector<std::string> shared(argv + 2, argv + argc);  // the options given to run go to every stage
    auto stage = [&](std::vector<std::string> args) {
        args.insert(args.begin(), "pipeline");
        args.insert(args.end(), shared.begin(), shared.end());
        return spawn(args);
    };
    std::vector<pid_t> pids = {
        stage({"sink", "--pull", at + "merged", "--upstream", "merger-0"}),
        stage({"merger", "--id", "merger-0", "--pull", at + "worked", "--push", at + "merged", "--upstream",
               "worker-0,worker-1"}),
        stage({"worker", "--id", "worker-0", "--pull", at + "work-0", "--push", at + "worked", "--upstream", "source"}),
        stage({"worker", "--id", "worker-1", "--pull", at + "work-1", "--push", at + "worked", "--upstream", "source"}),
        stage({"source", "--push", at + "work-0," + at + "work-1"}),
    };
    int failed = 0;
    for (pid_t pid : pids) {
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    }
    return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    if (!parse(argc, argv, o)) {
        std::fprintf(stderr,
                     "usage: pipeline run|source|worker|merger|sink [--id ID] [--pull EP] [--push EP] [--count N]\n"
                     "       [--rate PER_S] [--size BYTES] [--workers N] [--batch N] [--merge-cost-us US]\n"
                     "       [--work-us US] [--sndhwm N] [--rcvhwm N] [--run-id R] [--control EP] [--dir D]\n"
                     "       [--upstream IDS] [--slow STAGE [--slow-us US]]\n");
        return 2;
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    if (o.role == "run") {
        if (system(("mkdir -p '" + o.dir + "'").c_str()) != 0) return 1;
        return run_all(o, argc, argv);
    }
    zmq::context_t ctx;
    try {
        if (o.role == "source") return run_source(o, ctx);
        if (o.role == "worker") return run_worker(o, ctx);
        if (o.role == "merger") return run_merger(o, ctx);
        if (o.role == "sink") return run_sink(o, ctx);
    } catch (const zmq::error_t &e) {
        std::fprintf(stderr, "%s: %s\n", o.id.c_str(), e.what());
        return 1;
    }
    std::fprintf(stderr, "unknown role %s\n", o.role.c_str());
    return 2;
}
