// Host program of pool on ipu-gc2: builds the Poplar graph that graph_plan.hpp describes, runs it on
// the IPU Model ("--device model", target ipu1) or an attached IPU ("--device ipu") and reads the
// result back. Tensors are raw float32 files DATA/<name>.bin; the output is written to DATA/Y.bin
// and the median time of the compute program is printed as "rl_kernel_seconds <s>".
//   Y[nc,h,w] += X[nc,2*h+r-1,2*w+s-1] / 9.0
//   remote>tile 2x2x3x3x3 | tile>register 1x1x3x1x1 | grid 2 | block 4
#include <poplar/DeviceManager.hpp>
#include <poplar/Engine.hpp>
#include <poplar/Graph.hpp>
#include <poplar/IPUModel.hpp>
#include <poplar/Program.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph_plan.hpp"

using namespace poplar;
using namespace poplar::program;
namespace plan = rl_pool;

namespace {

std::vector<float> readTensor(const std::string &path, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> data(n);
  if (!in.read(reinterpret_cast<char *>(data.data()), std::streamsize(n * sizeof(float))))
    throw std::runtime_error("cannot read " + std::to_string(n) + " float32 values from " + path);
  return data;
}

void writeTensor(const std::string &path, const std::vector<float> &data) {
  std::ofstream out(path, std::ios::binary);
  if (!out.write(reinterpret_cast<const char *>(data.data()), std::streamsize(data.size() * sizeof(float))))
    throw std::runtime_error("cannot write " + path);
}

template <std::size_t N> std::vector<std::size_t> dims(const std::size_t (&shape)[N]) {
  return std::vector<std::size_t>(std::begin(shape), std::end(shape));
}

template <std::size_t R> Tensor boxOf(const Tensor &t, const plan::Box<R> &box) {
  return t.slice(std::vector<std::size_t>(box.begin, box.begin + R),
                 std::vector<std::size_t>(box.end, box.end + R)).flatten();
}

// Chunks of `chunk` elements on consecutive tiles: the mapping graph_plan.json counts.
void mapLinearly(Graph &graph, const Tensor &t, std::size_t chunk) {
  const Tensor flat = t.flatten();
  for (std::size_t tile = 0; tile * chunk < flat.numElements(); ++tile)
    graph.setTileMapping(flat.slice(tile * chunk, std::min((tile + 1) * chunk, flat.numElements())), tile);
}

Device openDevice(const std::string &kind) {
  if (kind == "ipu") {
    auto manager = DeviceManager::createDeviceManager();
    for (auto &device : manager.getDevices(TargetType::IPU, 1))
      if (device.attach()) return std::move(device);
    throw std::runtime_error("no IPU could be attached");
  }
  if (kind != "model") throw std::runtime_error("--device must be model or ipu, got " + kind);
  IPUModel model("ipu1");
  return model.createDevice();
}

}  // namespace

int main(int argc, char **argv) {
  std::string kind = "model", data = ".", codelets = "codelets.gp";
  unsigned repeat = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--device") kind = value;
    else if (key == "--data") data = value;
    else if (key == "--codelets") codelets = value;
    else if (key == "--repeat") repeat = unsigned(std::max(1, std::atoi(value.c_str())));
    else {
      std::cerr << "usage: " << argv[0] << " [--device model|ipu] [--data DIR] [--codelets FILE] [--repeat N]\n";
      return 2;
    }
  }
  if (!plan::kOnDevice) {
    std::cerr << "pool: its tensors exceed the IPU's tile memory; it needs streaming memory, which roller "
                 "does not generate\n";
    return 2;
  }
  try {
    Device device = openDevice(kind);
    const Target &target = device.getTarget();
    if (target.getNumTiles() < plan::kTiles)
      throw std::runtime_error("the plan uses " + std::to_string(plan::kTiles) + " tiles, the device has " +
                               std::to_string(target.getNumTiles()));
    Graph graph(target);
    graph.addCodelets(codelets);

    // Inputs spread over the tiles; the output is mapped below, slice by slice, with the vertex writing it.
    Tensor t_X = graph.addVariable(FLOAT, dims(plan::kStorage_X), "X");
    mapLinearly(graph, t_X, plan::kChunk_X);
    const Tensor t_X_view = t_X.reshape(dims(plan::kShape_X));  // fused axes
    Tensor t_Y = graph.addVariable(FLOAT, dims(plan::kStorage_Y), "Y");
    const Tensor t_Y_view = t_Y.reshape(dims(plan::kShape_Y));  // fused axes

    // One compute set per round; vertex b runs on tile b % kTiles in round b / kTiles.
    std::vector<ComputeSet> rounds;
    for (std::size_t r = 0; r < plan::kRounds; ++r)
      rounds.push_back(graph.addComputeSet("pool_round" + std::to_string(r)));
    for (std::size_t b = 0; b < plan::kVertices; ++b) {
      const plan::VertexPlan vp = plan::vertex(b);
      VertexRef v = graph.addVertex(rounds[vp.round], "rl_pool_vertex");
      graph.setTileMapping(v, vp.tile);
      graph.connect(v["X"], boxOf(t_X_view, vp.box_X));
      const Tensor out = boxOf(t_Y_view, vp.box_Y);
      graph.setTileMapping(out, vp.tile);
      graph.connect(v["Y"], out);
      graph.setInitialValue(v["rl_o_nc"], static_cast<unsigned>(vp.origin[0]));
      graph.setInitialValue(v["rl_o_h"], static_cast<unsigned>(vp.origin[1]));
      graph.setInitialValue(v["rl_o_w"], static_cast<unsigned>(vp.origin[2]));
      graph.setInitialValue(v["rl_lo_X_0"], static_cast<unsigned>(vp.box_X.begin[0]));
      graph.setInitialValue(v["rl_n_X_0"], static_cast<unsigned>(vp.box_X.extent(0)));
      graph.setInitialValue(v["rl_lo_X_1"], static_cast<unsigned>(vp.box_X.begin[1]));
      graph.setInitialValue(v["rl_n_X_1"], static_cast<unsigned>(vp.box_X.extent(1)));
      graph.setInitialValue(v["rl_lo_X_2"], static_cast<unsigned>(vp.box_X.begin[2]));
      graph.setInitialValue(v["rl_n_X_2"], static_cast<unsigned>(vp.box_X.extent(2)));
      graph.setInitialValue(v["rl_n_Y_0"], static_cast<unsigned>(vp.box_Y.extent(0)));
      graph.setInitialValue(v["rl_n_Y_1"], static_cast<unsigned>(vp.box_Y.extent(1)));
      graph.setInitialValue(v["rl_n_Y_2"], static_cast<unsigned>(vp.box_Y.extent(2)));
      if (kind == "model") graph.setPerfEstimate(v, 54);
    }

    // Program 0 copies the inputs in, program 1 runs the rounds, program 2 copies the output out.
    Sequence upload, compute, download;
    DataStream in_X = graph.addHostToDeviceFIFO("X", FLOAT, t_X.numElements());
    upload.add(Copy(in_X, t_X));
    for (ComputeSet &cs : rounds) compute.add(Execute(cs));
    DataStream out_Y = graph.addDeviceToHostFIFO("Y", FLOAT, t_Y.numElements());
    download.add(Copy(t_Y, out_Y));

    Engine engine(graph, std::vector<Program>{upload, compute, download});
    engine.load(device);
    std::vector<float> host_X = readTensor(data + "/X.bin", t_X.numElements());
    engine.connectStream("X", host_X.data());
    std::vector<float> host_Y(t_Y.numElements());
    engine.connectStream("Y", host_Y.data());
    engine.run(0);
    std::vector<double> seconds;
    for (unsigned i = 0; i < repeat; ++i) {
      const auto start = std::chrono::steady_clock::now();
      engine.run(1);
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    engine.run(2);
    writeTensor(data + "/Y.bin", host_Y);
    std::sort(seconds.begin(), seconds.end());
    std::cout << "rl_kernel_seconds " << seconds[seconds.size() / 2] << std::endl;
  } catch (const std::exception &e) {
    std::cerr << "pool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
