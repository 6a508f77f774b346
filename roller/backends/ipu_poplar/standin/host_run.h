// host_run.h -- helpers of roller's host-run check of generated Poplar codelets (tests only; see
// poplar_standin.h). The driver executes a graph plan vertex by vertex: it copies each slice the plan
// connects out of the tensor (what Poplar's exchange does), runs the codelet's workers, and copies the output
// slice back, counting how often every output element is written.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace rl_host_run {

inline std::vector<float> readFloats(const std::string &path, std::size_t n) {
  std::vector<float> data(n);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char *>(data.data()), std::streamsize(n * sizeof(float)))) {
    std::fprintf(stderr, "cannot read %zu float32 values from %s\n", n, path.c_str());
    std::exit(3);
  }
  return data;
}

template <class T> void writeRaw(const std::string &path, const std::vector<T> &data) {
  std::ofstream out(path, std::ios::binary);
  if (!out.write(reinterpret_cast<const char *>(data.data()), std::streamsize(data.size() * sizeof(T)))) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(3);
  }
}

// Calls f(offset in the tensor, offset in the box) for every point of the box, row-major.
template <std::size_t R, class Box, class F>
void forEachPoint(const std::size_t (&shape)[R], const Box &box, F f) {
  const std::size_t n = box.elements();
  for (std::size_t k = 0; k < n; ++k) {
    std::size_t rest = k, offset = 0, stride = 1;
    for (std::size_t d = R; d-- > 0;) {
      const std::size_t e = box.extent(d);
      offset += (box.begin[d] + rest % e) * stride;
      rest /= e;
      stride *= shape[d];
    }
    f(offset, k);
  }
}

template <std::size_t R, class Box>
std::vector<float> gather(const std::vector<float> &tensor, const std::size_t (&shape)[R], const Box &box) {
  std::vector<float> slice(box.elements());
  forEachPoint(shape, box, [&](std::size_t t, std::size_t s) { slice[s] = tensor[t]; });
  return slice;
}

template <std::size_t R, class Box>
void scatter(std::vector<float> &tensor, std::vector<unsigned char> &writes, const std::size_t (&shape)[R],
             const Box &box, const std::vector<float> &slice) {
  forEachPoint(shape, box, [&](std::size_t t, std::size_t s) {
    tensor[t] = slice[s];
    if (writes[t] < 255) ++writes[t];
  });
}

template <std::size_t R, class Box> void recordBox(std::ofstream &table, const Box &box) {
  for (std::size_t d = 0; d < R; ++d) table << ' ' << box.begin[d];
  for (std::size_t d = 0; d < R; ++d) table << ' ' << box.end[d];
}

}  // namespace rl_host_run
