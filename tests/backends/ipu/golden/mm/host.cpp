// Host program of mm on ipu-gc2: builds the Poplar graph that graph_plan.hpp describes, runs it on
// the IPU Model ("--device model", target ipu1) or an attached IPU ("--device ipu") and reads the
// result back. Tensors are raw float32 files DATA/<name>.bin; the output is written to DATA/C.bin
// and the median time of the compute program is printed as "rl_kernel_seconds <s>".
//   C[m,n] += A[m,k] * B[k,n]
//   remote>tile 2x4x3 | tile>register 1x2x1 | grid 6 | block 4
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
namespace plan = rl_mm;

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
    std::cerr << "mm: its tensors exceed the IPU's tile memory; it needs streaming memory, which roller "
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
    Tensor t_A = graph.addVariable(FLOAT, dims(plan::kStorage_A), "A");
    mapLinearly(graph, t_A, plan::kChunk_A);
    const Tensor t_A_view = t_A;
    Tensor t_B = graph.addVariable(FLOAT, dims(plan::kStorage_B), "B");
    mapLinearly(graph, t_B, plan::kChunk_B);
    const Tensor t_B_view = t_B;
    Tensor t_C = graph.addVariable(FLOAT, dims(plan::kStorage_C), "C");
    const Tensor t_C_view = t_C;

    // One compute set per round; vertex b runs on tile b % kTiles in round b / kTiles.
    std::vector<ComputeSet> rounds;
    for (std::size_t r = 0; r < plan::kRounds; ++r)
      rounds.push_back(graph.addComputeSet("mm_round" + std::to_string(r)));
    for (std::size_t b = 0; b < plan::kVertices; ++b) {
      const plan::VertexPlan vp = plan::vertex(b);
      VertexRef v = graph.addVertex(rounds[vp.round], "rl_mm_vertex");
      graph.setTileMapping(v, vp.tile);
      graph.connect(v["A"], boxOf(t_A_view, vp.box_A));
      graph.connect(v["B"], boxOf(t_B_view, vp.box_B));
      const Tensor out = boxOf(t_C_view, vp.box_C);
      graph.setTileMapping(out, vp.tile);
      graph.connect(v["C"], out);
      graph.setInitialValue(v["rl_o_m"], static_cast<unsigned>(vp.origin[0]));
      graph.setInitialValue(v["rl_o_n"], static_cast<unsigned>(vp.origin[1]));
      graph.setInitialValue(v["rl_lo_A_0"], static_cast<unsigned>(vp.box_A.begin[0]));
      graph.setInitialValue(v["rl_n_A_0"], static_cast<unsigned>(vp.box_A.extent(0)));
      graph.setInitialValue(v["rl_lo_A_1"], static_cast<unsigned>(vp.box_A.begin[1]));
      graph.setInitialValue(v["rl_n_A_1"], static_cast<unsigned>(vp.box_A.extent(1)));
      graph.setInitialValue(v["rl_lo_B_0"], static_cast<unsigned>(vp.box_B.begin[0]));
      graph.setInitialValue(v["rl_n_B_0"], static_cast<unsigned>(vp.box_B.extent(0)));
      graph.setInitialValue(v["rl_lo_B_1"], static_cast<unsigned>(vp.box_B.begin[1]));
      graph.setInitialValue(v["rl_n_B_1"], static_cast<unsigned>(vp.box_B.extent(1)));
      graph.setInitialValue(v["rl_n_C_0"], static_cast<unsigned>(vp.box_C.extent(0)));
      graph.setInitialValue(v["rl_n_C_1"], static_cast<unsigned>(vp.box_C.extent(1)));
      if (kind == "model") graph.setPerfEstimate(v, 12);
    }

    // Program 0 copies the inputs in, program 1 runs the rounds, program 2 copies the output out.
    Sequence upload, compute, download;
    DataStream in_A = graph.addHostToDeviceFIFO("A", FLOAT, t_A.numElements());
    upload.add(Copy(in_A, t_A));
    DataStream in_B = graph.addHostToDeviceFIFO("B", FLOAT, t_B.numElements());
    upload.add(Copy(in_B, t_B));
    for (ComputeSet &cs : rounds) compute.add(Execute(cs));
    DataStream out_C = graph.addDeviceToHostFIFO("C", FLOAT, t_C.numElements());
    download.add(Copy(t_C, out_C));

    Engine engine(graph, std::vector<Program>{upload, compute, download});
    engine.load(device);
    std::vector<float> host_A = readTensor(data + "/A.bin", t_A.numElements());
    engine.connectStream("A", host_A.data());
    std::vector<float> host_B = readTensor(data + "/B.bin", t_B.numElements());
    engine.connectStream("B", host_B.data());
    std::vector<float> host_C(t_C.numElements());
    engine.connectStream("C", host_C.data());
    engine.run(0);
    std::vector<double> seconds;
    for (unsigned i = 0; i < repeat; ++i) {
      const auto start = std::chrono::steady_clock::now();
      engine.run(1);
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    engine.run(2);
    writeTensor(data + "/C.bin", host_C);
    std::sort(seconds.begin(), seconds.end());
    std::cout << "rl_kernel_seconds " << seconds[seconds.size() / 2] << std::endl;
  } catch (const std::exception &e) {
    std::cerr << "mm: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
